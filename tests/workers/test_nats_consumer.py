"""The NATS JetStream consumer: a message is acknowledged only after its articles are committed, a
message that can never be stored is terminated with its reasons kept, a failed commit gets the batch
delivered again, a redelivery stores nothing twice, and an unreachable server is a status, not a
crash. The tests against a real server (the local NATS with JetStream) run where SQA_TEST_NATS_URL
is set, as `.ci/run` does; the others need no server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import threading
import time
import uuid
from dataclasses import replace
from types import SimpleNamespace

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap import worker_services
from app.bootstrap.builders import open_database
from app.bootstrap.job_configs import nats_config
from store.tables import Article, LiveQueueItem
from workers.nats_consumer import NatsConsumer, read_status, subscribe

NATS_URL = os.environ.get("SQA_TEST_NATS_URL", "")
needs_nats = pytest.mark.skipif(not NATS_URL, reason="SQA_TEST_NATS_URL is not set (a NATS server with JetStream)")
TODAY = dt.date(2024, 4, 10)


def article(i: int, **over) -> dict:
    body = {
        "url": f"https://wire.example/{i}",
        "title": f"Wire {i}",
        "published": "2024-04-09",
        "text": f"The ferry captain Ilse Marrow{i} sailed the new route to the islands on Tuesday.",
        "source": "wire",
    }
    body.update(over)
    return body


class FakeMsg:
    """What the consumer uses of a nats-py JetStream message."""

    def __init__(self, data: bytes, seq: int, delivered: int = 1):
        self.data = data
        self.metadata = SimpleNamespace(num_delivered=delivered, sequence=SimpleNamespace(stream=seq))
        self.outcome: str | None = None

    async def ack(self):
        self.outcome = "ack"

    async def nak(self, delay=None):
        self.outcome = "nak"

    async def term(self):
        self.outcome = "term"


def stored(db) -> tuple[int, list[str]]:
    with db.sessions() as s:
        return (
            s.scalar(select(func.count()).select_from(Article)),
            list(s.scalars(select(LiveQueueItem.via))),
        )


@pytest.fixture
def nats_settings(settings):
    return settings.model_copy(update={"nats_url": "nats://127.0.0.1:1"})


def test_messages_are_stored_then_acknowledged_and_bad_ones_terminated(nats_settings):
    db = open_database(nats_settings)
    try:
        consumer = NatsConsumer(db.sessions, nats_config(nats_settings), today=lambda: TODAY)
        one = FakeMsg(json.dumps(article(1)).encode(), 1)
        mixed = FakeMsg((json.dumps(article(2)) + "\n" + json.dumps(article(3, published="2024-13-01"))).encode(), 2)
        junk = FakeMsg(b"\xff\xfe not json", 3)
        counts = asyncio.run(consumer.handle([one, mixed, junk]))
        assert (counts.new, counts.duplicate) == (2, 0)
        assert [m.outcome for m in (one, mixed, junk)] == ["ack", "ack", "term"]
        assert stored(db) == (2, ["nats", "nats"])
        s = consumer.status
        assert (s.messages, s.new, s.rejected, s.terminated) == (3, 2, 2, 1)
        reasons = {(r["message"], r["field"]) for r in s.recent_rejections}
        assert reasons == {("stream sequence 2", "published"), ("stream sequence 3", "record")}

        # Delivered again (the consumer crashed before its acknowledgement): nothing is stored twice.
        again = FakeMsg(one.data, 1, delivered=2)
        counts = asyncio.run(consumer.handle([again]))
        assert (counts.new, counts.duplicate, again.outcome) == (0, 1, "ack")
        assert stored(db)[0] == 2 and consumer.status.redelivered == 1
        # A changed text under the same URL is a new version of the article.
        changed = FakeMsg(json.dumps(article(1, text="The ferry captain changed the route again.")).encode(), 4)
        assert asyncio.run(consumer.handle([changed])).updated == 1
    finally:
        db.close()


def test_a_failed_commit_acknowledges_nothing_and_the_batch_is_stored_when_it_comes_again(nats_settings):
    db = open_database(nats_settings)
    try:

        class Broken:
            def __call__(self):
                raise OSError("disk full")

        failing = NatsConsumer(Broken(), nats_config(nats_settings), today=lambda: TODAY)
        msgs = [FakeMsg(json.dumps(article(i)).encode(), i) for i in (1, 2)]
        with pytest.raises(OSError, match="disk full"):
            asyncio.run(failing.handle(msgs))
        assert [m.outcome for m in msgs] == ["nak", "nak"]
        assert stored(db)[0] == 0 and failing.status.messages == 0

        consumer = NatsConsumer(db.sessions, nats_config(nats_settings), today=lambda: TODAY)
        again = [FakeMsg(m.data, i, delivered=2) for i, m in enumerate(msgs, 1)]
        assert asyncio.run(consumer.handle(again)).new == 2
        assert [m.outcome for m in again] == ["ack", "ack"] and stored(db)[0] == 2
    finally:
        db.close()


def test_an_unreachable_server_is_a_status_not_a_crash(nats_settings):
    db = open_database(nats_settings)
    try:
        cfg = nats_config(nats_settings)
        consumer = NatsConsumer(db.sessions, cfg)
        thread = threading.Thread(target=consumer.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while read_status(cfg.status_file) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        consumer.stop()
        thread.join(30)
        assert not thread.is_alive()
        status = read_status(cfg.status_file)
        assert status is not None and status["connected"] is False and status["last_error"]
    finally:
        db.close()


def test_worker_runs_the_consumer_and_live_status_shows_it(nats_settings, make_settings):
    db = open_database(nats_settings)
    try:
        assert NatsConsumer in [type(x) for x in worker_services(nats_settings, db)]
        assert NatsConsumer not in [type(x) for x in worker_services(make_settings(), db)]
    finally:
        db.close()
    from app.main import create_app

    headers = {"X-Admin-Token": "test-admin-token"}
    with TestClient(create_app(nats_settings)) as client:
        broker = client.get("/admin/live", headers=headers).json()["broker"]
        assert broker["connected"] is False and "sqa worker" in broker["last_error"]
        consumer = NatsConsumer(client.app.state.db.sessions, nats_config(nats_settings), today=lambda: TODAY)
        asyncio.run(consumer.handle([FakeMsg(b"[]", 7), FakeMsg(json.dumps(article(5)).encode(), 8)]))
        consumer.save_status()
        broker = client.get("/admin/live", headers=headers).json()["broker"]
        assert (broker["messages"], broker["new"], broker["terminated"]) == (2, 1, 1)
        assert client.post("/dashboard/login", data={"token": "test-admin-token"}).status_code == 200
        page = client.get("/dashboard").text
        assert 'id="broker-status"' in page and "1 new" in page


# ---- against the local NATS server ----------------------------------------------------------------


async def _publish(url: str, subject: str, bodies: list[bytes], stream: str | None = None) -> None:
    """Publish `bodies` to `subject` (first making `stream` for it, where given)."""
    import nats

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        if stream:
            await js.add_stream(name=stream, subjects=[subject])
        for body in bodies:
            await js.publish(subject, body)
    finally:
        await nc.close()


async def _pending(url: str, stream: str, durable: str) -> tuple[int, int]:
    """(messages not yet delivered, delivered and not acknowledged) of the durable consumer."""
    import nats

    nc = await nats.connect(url)
    try:
        info = await nc.jetstream().consumer_info(stream, durable)
        return info.num_pending, info.num_ack_pending
    finally:
        await nc.close()


def _settled(cfg) -> tuple[int, int]:
    """The durable's (pending, unacknowledged) once both are 0, or as they are after 30 s: the server
    applies acknowledgements sent just before a consumer closed a moment later."""
    deadline = time.monotonic() + 30
    while (now := asyncio.run(_pending(cfg.url, cfg.stream, cfg.durable))) != (0, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


async def _take_without_ack(url: str, cfg) -> int:
    """A consumer that fetches and dies before acknowledging: returns how many it took."""
    import nats

    nc = await nats.connect(url)
    try:
        sub = await subscribe(nc.jetstream(), cfg)
        return len(await sub.fetch(10, timeout=5))
    finally:
        await nc.close()


async def _drop_stream(url: str, stream: str) -> None:
    import nats

    nc = await nats.connect(url)
    try:
        await nc.jetstream().delete_stream(stream)
    finally:
        await nc.close()


def _run_until(consumer: NatsConsumer, cfg, db, articles: int) -> None:
    """Run `consumer` until `articles` are stored and its durable has nothing pending or unacknowledged
    (a message stored by a killed consumer and never acknowledged comes again after the ack wait)."""
    thread = threading.Thread(target=consumer.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not (
            stored(db)[0] >= articles and asyncio.run(_pending(cfg.url, cfg.stream, cfg.durable)) == (0, 0)
        ):
            time.sleep(0.2)
    finally:
        consumer.stop()
        thread.join(30)
    assert not thread.is_alive()


@needs_nats
def test_a_real_stream_is_consumed_and_every_message_acknowledged(nats_settings):
    tag = uuid.uuid4().hex[:10]
    cfg = replace(nats_config(nats_settings), url=NATS_URL, subject=f"sqa.test.{tag}", stream=f"SQA_TEST_{tag}")
    db = open_database(nats_settings)
    try:
        first = NatsConsumer(db.sessions, cfg)
        # The consumer makes the stream, then the articles are published while it runs.
        thread = threading.Thread(target=first.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not (read_status(cfg.status_file) or {}).get("connected") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (read_status(cfg.status_file) or {}).get("connected"), read_status(cfg.status_file)
        bodies = [json.dumps(article(1)).encode(), b"not json", json.dumps([article(2), article(1)]).encode()]
        asyncio.run(_publish(NATS_URL, cfg.subject, bodies))
        deadline = time.monotonic() + 60
        while stored(db)[0] < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        first.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert stored(db)[0] == 2
        assert _settled(cfg) == (0, 0)
        status = read_status(cfg.status_file)
        assert status is not None and (status["messages"], status["terminated"], status["new"]) == (3, 1, 2)
        assert status["connected"] is False  # stopped

        # A consumer that takes a message and dies before acknowledging it: the message comes again
        # after ack_wait, to the next consumer of the same durable, and is stored once.
        short = replace(cfg, ack_wait_s=1.0)
        asyncio.run(_publish(NATS_URL, cfg.subject, [json.dumps(article(3)).encode()]))
        assert asyncio.run(_take_without_ack(NATS_URL, short)) == 1
        assert stored(db)[0] == 2
        second = NatsConsumer(db.sessions, short)
        _run_until(second, short, db, 3)
        assert stored(db)[0] == 3 and second.status.redelivered == 1
        assert _settled(cfg) == (0, 0)
    finally:
        db.close()
        asyncio.run(_drop_stream(NATS_URL, cfg.stream))


def test_sqa_live_status_shows_the_consumer(sqa, monkeypatch, tmp_path):
    from settings import get_settings

    monkeypatch.setenv("SQA_NATS_URL", "nats://127.0.0.1:1")
    get_settings.cache_clear()
    r = sqa("live", "status")
    assert r.exit_code == 0, r.output
    assert "nats sqa.articles at nats://127.0.0.1:1: no status yet" in r.output
    consumer = NatsConsumer(None, nats_config(get_settings()))  # type: ignore[arg-type]
    consumer.status.messages, consumer.status.last_error = 4, "ConnectionRefusedError: refused"
    consumer.save_status()
    r = sqa("live", "status")
    assert "not connected; 4 message(s)" in r.output and "last error: ConnectionRefusedError" in r.output


CHILD = """
import json, sys
from dataclasses import replace
from app.bootstrap.builders import open_database
from app.bootstrap.job_configs import nats_config
from settings import Settings
from workers.nats_consumer import NatsConsumer

args = json.loads(sys.argv[1])
s = Settings(home=args["home"], database_url=args["db"], encoder="hash", reader="first-entity", nats_url=args["url"])
cfg = replace(nats_config(s), subject=args["subject"], stream=args["stream"], ack_wait_s=2.0, batch=8)
NatsConsumer(open_database(s, migrate=False).sessions, cfg).run()
"""


@needs_nats
def test_a_consumer_killed_at_random_points_loses_and_duplicates_nothing(nats_settings):
    """kill -9 of the consuming process three times while 150 articles stream in: each article is
    stored once, and every message ends acknowledged (a message is acknowledged after its commit)."""
    import random
    import signal
    import subprocess
    import sys

    tag = uuid.uuid4().hex[:10]
    cfg = replace(
        nats_config(nats_settings), url=NATS_URL, subject=f"sqa.kill.{tag}", stream=f"SQA_KILL_{tag}", ack_wait_s=2.0
    )
    db = open_database(nats_settings)
    rng = random.Random(tag)
    total = 150
    args = json.dumps(
        {
            "home": str(nats_settings.home),
            "db": nats_settings.database_url,
            "url": NATS_URL,
            "subject": cfg.subject,
            "stream": cfg.stream,
        }
    )
    try:
        bodies = [json.dumps(article(i)).encode() for i in range(total)]
        asyncio.run(_publish(NATS_URL, cfg.subject, bodies, stream=cfg.stream))
        for _ in range(3):
            child = subprocess.Popen([sys.executable, "-c", CHILD, args])
            target = min(total - 1, stored(db)[0] + rng.randint(1, 40))
            deadline = time.monotonic() + 120
            while stored(db)[0] < target and time.monotonic() < deadline and child.poll() is None:
                time.sleep(0.01)
            child.send_signal(signal.SIGKILL)
            assert child.wait(30) == -signal.SIGKILL
        last = NatsConsumer(db.sessions, cfg)
        _run_until(last, cfg, db, total)
        with db.sessions() as s:
            urls = list(s.scalars(select(Article.url)))
        assert len(urls) == total and len(set(urls)) == total
        assert _settled(cfg) == (0, 0)
    finally:
        db.close()
        asyncio.run(_drop_stream(NATS_URL, cfg.stream))
