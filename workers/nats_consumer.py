"""The NATS JetStream consumer (SQA_NATS_URL): articles published to a subject are stored and queued
for the live shard, each message acknowledged only after its articles are committed.

A message's body is what `POST /admin/articles` takes: one JSON article, a JSON array, or NDJSON.

- Its good records are stored (store/intake.py: idempotent by URL and text) in one transaction with
  the rest of the fetched batch; then each message is acknowledged. A crash before the
  acknowledgement gets the message delivered again, which stores nothing twice.
- A message none of whose records can be stored (not JSON, every record rejected) is terminated: it
  would fail the same way each time. Its reasons are kept in the status (`recent_rejections`), as
  are those of the bad records of a message whose other records were stored.
- A failed commit (the database away, a full disk) gets the batch's messages negatively
  acknowledged with a delay: they come again, and nothing is lost.
- The NATS server away: the status says so, and the consumer connects again with backoff; the
  worker goes on.

The stream is made (file storage, the one subject) when it is missing; the durable pull consumer
(explicit acknowledgements) keeps its place across restarts. The status is written to
`<work_dir>/nats-status.json` after each batch, for `GET /admin/live` and the dashboard.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import json
import logging
import os
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig
from sqlalchemy.orm import Session, sessionmaker

from indexer.push import BodyError, parse_articles
from store.intake import IntakeCounts, intake_articles
from workers.config import NatsConfig

log = logging.getLogger(__name__)

RECENT = 10  # rejections kept in the status
MAX_BACKOFF_S = 60.0  # between two tries to reach the server


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass
class ConsumerStatus:
    """What the consumer has done since the worker started (GET /admin/live's `broker`)."""

    url: str
    subject: str
    connected: bool = False
    messages: int = 0  # acknowledged or terminated
    new: int = 0
    updated: int = 0
    duplicate: int = 0
    rejected: int = 0  # records
    terminated: int = 0  # messages with nothing to store
    redelivered: int = 0  # messages delivered before (a crash, or a failed commit)
    last_message_at: str | None = None
    last_error: str | None = None
    last_error_at: str | None = None
    recent_rejections: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def read_status(path: Path) -> dict[str, Any] | None:
    """The status the worker's consumer last wrote, or None (no consumer, or never written)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


async def subscribe(js: Any, cfg: NatsConfig) -> Any:
    """The durable pull consumer on the stream, made or brought to `cfg` (its ack wait), and bound."""
    await js.add_consumer(
        cfg.stream,
        config=ConsumerConfig(
            durable_name=cfg.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=cfg.ack_wait_s,
            filter_subject=cfg.subject,
        ),
    )
    return await js.pull_subscribe_bind(durable=cfg.durable, stream=cfg.stream)


class NatsConsumer:
    """Consumes `cfg.subject` into the live queue: `run()` in a thread of the worker, until `stop()`."""

    def __init__(
        self, sf: sessionmaker[Session], cfg: NatsConfig, *, today: Callable[[], dt.date] | None = None
    ) -> None:
        self._sf, self._cfg = sf, cfg
        self._today = today or (lambda: dt.datetime.now(dt.UTC).date())
        self._stop = threading.Event()
        self.status = ConsumerStatus(url=cfg.url, subject=cfg.subject)

    @property
    def last_error(self) -> str | None:
        return self.status.last_error

    # ---- one batch -------------------------------------------------------------------------------

    async def handle(self, msgs: Sequence[Any]) -> IntakeCounts:
        """Store a fetched batch, then acknowledge it (the module's docstring says how each ends).

        Raises what storing raised, after the batch was negatively acknowledged."""
        keep, drop = [], []
        for msg in msgs:
            meta = msg.metadata
            if meta.num_delivered > 1:
                self.status.redelivered += 1
            where = f"stream sequence {meta.sequence.stream}"
            try:
                batch = parse_articles(msg.data, today=self._today(), limits=self._cfg.limits)
            except BodyError as exc:
                self._reject({"message": where, "line": None, "field": "body", "reason": str(exc), "url": None})
                drop.append(msg)
                continue
            for r in batch.rejected:
                self._reject({"message": where, **r.to_dict()})
            if batch.records:
                keep.append((msg, batch))
            else:
                drop.append(msg)

        def store() -> IntakeCounts:
            total = IntakeCounts()
            with self._sf() as session, session.begin():
                for _, batch in keep:
                    total.add(intake_articles(session, [r for _, r in batch.records], via="nats"))
            return total

        try:
            counts = await asyncio.to_thread(store) if keep else IntakeCounts()
        except Exception:
            for msg, _ in keep:
                await msg.nak(delay=self._cfg.retry_s)
            raise
        finally:
            for msg in drop:  # they would fail the same way again
                await msg.term()
            self.status.terminated += len(drop)
        for msg, _ in keep:
            await msg.ack()
        s = self.status
        s.messages += len(msgs)
        s.new, s.updated, s.duplicate = s.new + counts.new, s.updated + counts.updated, s.duplicate + counts.duplicate
        s.last_message_at = _now()
        if keep or drop:
            log.info("nats: %d message(s): %s, %d terminated", len(msgs), counts.to_dict(), len(drop))
        return counts

    def _reject(self, item: dict[str, Any]) -> None:
        self.status.rejected += 1
        self.status.recent_rejections = [*self.status.recent_rejections, item][-RECENT:]

    def _error(self, exc: BaseException) -> None:
        self.status.last_error = f"{type(exc).__name__}: {exc}"[:2000]
        self.status.last_error_at = _now()

    def save_status(self) -> None:
        path = self._cfg.status_file
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self.status)))
        os.replace(tmp, path)

    # ---- the loop --------------------------------------------------------------------------------

    def run(self) -> None:
        """Consume until `stop()`: connect, fetch and handle batches; on any error say it and try again."""
        asyncio.run(self._run())

    def stop(self) -> None:
        self._stop.set()

    async def _sleep(self, seconds: float) -> bool:
        """Wait, or less if stopped; True when stopped."""
        return await asyncio.to_thread(self._stop.wait, seconds)

    async def _run(self) -> None:
        backoff = 1.0
        while not self._stop.is_set():
            try:
                await self._consume()
                return
            except Exception as exc:  # the server away, the stream refused: said, and tried again
                self._error(exc)
                self.status.connected = False
                self.save_status()
                log.warning("nats consumer (%s): %s; trying again in %.0f s", self._cfg.url, exc, backoff)
                if await self._sleep(backoff):
                    return
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def _on_disconnect(self) -> None:
        self.status.connected = False
        self.save_status()

    async def _on_reconnect(self) -> None:
        self.status.connected = True
        self.save_status()

    async def _on_error(self, exc: Exception) -> None:
        self._error(exc)

    async def _consume(self) -> None:
        cfg = self._cfg
        nc = await nats.connect(
            cfg.url,
            connect_timeout=5,
            # A few tries (the first connection's too), then the client closes and `_run` tries again
            # with backoff, watching `stop()` between tries.
            max_reconnect_attempts=3,
            reconnect_time_wait=1,
            disconnected_cb=self._on_disconnect,
            reconnected_cb=self._on_reconnect,
            error_cb=self._on_error,
        )
        try:
            js = nc.jetstream()
            try:
                await js.stream_info(cfg.stream)
            except nats.js.errors.NotFoundError:
                await js.add_stream(name=cfg.stream, subjects=[cfg.subject])
                log.info("nats: made the stream %s for %s", cfg.stream, cfg.subject)
            sub = await subscribe(js, cfg)
            self.status.connected, self.status.last_error = True, None
            self.save_status()
            while not self._stop.is_set():
                try:
                    msgs = await sub.fetch(cfg.batch, timeout=cfg.poll_s)
                except nats.errors.TimeoutError:
                    continue
                try:
                    await self.handle(msgs)
                except Exception as exc:  # storing failed: the batch comes again after cfg.retry_s
                    self._error(exc)
                    log.exception("nats: storing a batch failed; it is delivered again in %.0f s", cfg.retry_s)
                    await self._sleep(cfg.retry_s)
                self.save_status()
        finally:
            self.status.connected = False
            self.save_status()
            await nc.close()
