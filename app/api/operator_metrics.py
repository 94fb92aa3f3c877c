"""The operator's metrics at /metrics, beside the per-route request counts: where an answer's time
goes, the answer gate, the index that serves, how fresh it is, how fast ingest runs, the jobs.

- Observed as answers are served (`observe_answers`, called by the JSON API and the ask page):
  `sqa_answer_stage_seconds{stage}` from each answer's `timings_ms`, `sqa_answer_queue_wait_seconds`
  from the gate's queue time; `sqa_reader_batch_size` and `sqa_reader_batch_wait_seconds` from
  each batch of readings (serving.reader_batching, when SQA_READER_BATCH is above 1).
- Read at scrape time (`OperatorCollector`): the gate's running, waiting and refused answers, the
  answer cache's hits, stores and entries (serving.answer_cache), the serving snapshot (vectors,
  shards, id, age), the newest searchable article's age and the live articles waiting (the figures
  of the ask page's freshness line), the passages/s of the last finished ingest job, and the jobs
  by kind and state. One database session per scrape; a family whose query fails is logged and
  left out, the rest of /metrics is still served.

Not here: the passages/s of the last live publish (the worker's publisher keeps its
result in memory only; nothing the API process can read records it).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from fastapi import FastAPI, Request
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from serving.admission import AdmissionGate
from serving.answer_cache import AnswerCache
from serving.answering import AnswerResult
from serving.index_state import LoadedSnapshot
from store.queries import newest_indexed_article_at
from store.tables import Job
from workers.live_publisher import queue_status

log = logging.getLogger(__name__)

STAGES = ("retrieve", "rerank", "read", "cache", "total")  # the keys of AnswerResult.timings_ms
SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
QUEUE_BUCKETS = (0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.5, 10.0)  # SQA_ANSWER_WAIT_S is 4.5
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 32, 64)  # SQA_READER_BATCH is at most 64


class AnswerMetrics:
    """The histograms observed per served answer, registered in one app's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.stage_seconds = Histogram(
            "sqa_answer_stage_seconds",
            "Seconds an answer spent in each stage (retrieve, rerank, read, total), per served answer; "
            "an answer from the answer cache only in 'cache'",
            ["stage"],
            buckets=SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_wait_seconds = Histogram(
            "sqa_answer_queue_wait_seconds",
            "Seconds an admitted answer request waited, from its arrival until the answer gate let it in",
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )

        self.batch_size = Histogram(
            "sqa_reader_batch_size",
            "Questions read in one reader call (serving.reader_batching), per batch",
            buckets=BATCH_BUCKETS,
            registry=registry,
        )
        self.batch_wait_seconds = Histogram(
            "sqa_reader_batch_wait_seconds",
            "Seconds a reading waited at the reader, from reaching it until its batch started",
            buckets=QUEUE_BUCKETS,
            registry=registry,
        )

    def observe_batch(self, size: int, waits_s: Sequence[float]) -> None:
        """One batch of readings as it starts (serving.reader_batching.ReaderBatcher's `on_batch`)."""
        self.batch_size.observe(size)
        for wait in waits_s:
            self.batch_wait_seconds.observe(max(0.0, wait))

    def observe(self, results: Iterable[AnswerResult], queued_s: float | None) -> None:
        if queued_s is not None:
            self.queue_wait_seconds.observe(max(0.0, queued_s))
        for result in results:
            if "cache" in result.timings_ms:  # served again: its lookup, not a computed answer's stages
                self.stage_seconds.labels(stage="cache").observe(result.timings_ms["cache"] / 1000)
                continue
            for stage, ms in result.timings_ms.items():
                if stage in STAGES:
                    self.stage_seconds.labels(stage=stage).observe(ms / 1000)


def observe_answers(request: Request, results: Sequence[AnswerResult], queued_s: float | None) -> None:
    """Count one admitted turn of the answer gate (its queue time; None: the answers came from the
    answer cache, with no turn) and the answers given (the ask page may answer two dates at once).
    Nothing when the app has no /metrics."""
    metrics: AnswerMetrics | None = getattr(request.app.state, "answer_metrics", None)
    if metrics is not None:
        metrics.observe(results, queued_s)


def _seconds_since(when: dt.datetime | None, now: dt.datetime) -> float | None:
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return max(0.0, (now - when).total_seconds())


def last_ingest_passages_per_s(session: Session) -> float | None:
    """Passages/s of the newest succeeded ingest job: its shards' passages over their chunk, encode
    and commit seconds (each shard's own `passages_per_s` is the same ratio); None if there is none
    or it indexed nothing."""
    job = session.scalars(
        select(Job)
        .where(Job.kind == "ingest", Job.state == "succeeded", Job.finished_at.is_not(None))
        .order_by(Job.finished_at.desc(), Job.id.desc())
        .limit(1)
    ).first()
    if job is None:
        return None
    passages, seconds = 0, 0.0
    counts = job.counts or {}
    for key, t in (job.timings or {}).items():
        c = counts.get(key)
        if isinstance(t, dict) and isinstance(c, dict) and "passages_per_s" in t:
            passages += int(c.get("passages", 0))
            seconds += sum(float(t.get(k, 0.0)) for k in ("chunk_s", "encode_s", "commit_s"))
    return passages / seconds if passages and seconds > 0 else None


class OperatorCollector(Collector):
    """The scrape-time families, computed from `app.state` (nothing before the lifespan has run)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    def collect(self) -> Iterator[Metric]:
        state = self.app.state
        gate, answers, db = (getattr(state, n, None) for n in ("answer_gate", "answers", "db"))
        now = dt.datetime.now(dt.UTC)
        if gate is not None:
            yield from self._family("answer gate", lambda: self._gate(gate))
        if answers is not None and answers.cache is not None:
            yield from self._family("answer cache", lambda: self._cache(answers.cache))
        snap = answers.index_state.current() if answers is not None else None
        if snap is not None:
            yield from self._family("index", lambda: self._index(snap, now))
        if db is None:
            return
        with db.sessions() as session:  # one session for every query of this scrape
            yield from self._family("freshness", lambda: self._freshness(session, snap, now), session)
            yield from self._family("ingest rate", lambda: self._ingest_rate(session), session)
            yield from self._family("jobs", lambda: self._jobs(session), session)

    @staticmethod
    def _family(what: str, make: Callable[[], list[Metric]], session: Session | None = None) -> list[Metric]:
        """The families `make` builds, or none when it fails (logged; the session is rolled back so
        that the next query runs, as PostgreSQL refuses any in an aborted transaction)."""
        try:
            return make()
        except Exception:
            log.exception("/metrics: could not compute the %s metrics; left out of this scrape", what)
            if session is not None:
                session.rollback()
            return []

    @staticmethod
    def _gate(gate: AdmissionGate) -> list[Metric]:
        running = GaugeMetricFamily("sqa_answers_running", "Answers being computed now (the gate's busy places)")
        running.add_metric([], gate.active)
        waiting = GaugeMetricFamily("sqa_answers_waiting", "Answer requests waiting for a place at the answer gate")
        waiting.add_metric([], gate.waiting)
        slots = GaugeMetricFamily(
            "sqa_answer_concurrency_limit", "Answers run at once at most (SQA_ANSWER_CONCURRENCY)"
        )
        slots.add_metric([], gate.max_active)
        room = GaugeMetricFamily("sqa_answer_queue_limit", "Answer requests that may wait at most (SQA_ANSWER_QUEUE)")
        room.add_metric([], gate.max_waiting)
        refused = CounterMetricFamily(
            "sqa_answer_refusals",
            "Answer requests refused with 503 since start, by reason: queue_full (SQA_ANSWER_QUEUE) or "
            "wait_budget (no place freed in time, SQA_ANSWER_WAIT_S)",
            labels=["reason"],
        )
        for reason, n in gate.refusals().items():
            refused.add_metric([reason], n)
        return [running, waiting, slots, room, refused]

    @staticmethod
    def _cache(cache: AnswerCache) -> list[Metric]:
        hits = CounterMetricFamily(
            "sqa_answer_cache_hits", "Answers served again from the answer cache since start (SQA_ANSWER_CACHE)"
        )
        hits.add_metric([], cache.hits)
        stores = CounterMetricFamily(
            "sqa_answer_cache_stores", "Answers computed and kept in the answer cache since start"
        )
        stores.add_metric([], cache.stores)
        entries = GaugeMetricFamily("sqa_answer_cache_entries", "Answers in the answer cache now")
        entries.add_metric([], len(cache))
        return [hits, stores, entries]

    @staticmethod
    def _index(snap: LoadedSnapshot, now: dt.datetime) -> list[Metric]:
        vectors = GaugeMetricFamily("sqa_index_vectors", "Vectors in the serving index snapshot")
        vectors.add_metric([], snap.index.ntotal)
        shards = GaugeMetricFamily("sqa_index_shards", "Shards (month shards and live pieces) in the serving snapshot")
        shards.add_metric([], len(snap.manifest.shards))
        info = GaugeMetricFamily(
            "sqa_index_snapshot", "The serving index snapshot (always 1; its id in the label)", labels=["snapshot_id"]
        )
        info.add_metric([snap.snapshot_id], 1)
        age = GaugeMetricFamily("sqa_index_snapshot_age_seconds", "Seconds since the serving snapshot was committed")
        age.add_metric([], _seconds_since(dt.datetime.fromisoformat(snap.manifest.created_at), now) or 0.0)
        return [vectors, shards, info, age]

    @staticmethod
    def _freshness(session: Session, snap: LoadedSnapshot | None, now: dt.datetime) -> list[Metric]:
        # the figures of the ask page's freshness line (app.web.pages.freshness, via live_status)
        out: list[Metric] = []
        newest = newest_indexed_article_at(session, snap.manifest if snap else None)
        age = _seconds_since(newest, now)
        if age is not None:
            g = GaugeMetricFamily(
                "sqa_newest_article_age_seconds",
                "Seconds since the newest searchable article arrived (stored or changed)",
            )
            g.add_metric([], age)
            out.append(g)
        waiting = GaugeMetricFamily("sqa_live_articles_waiting", "Live articles stored and waiting to be indexed")
        waiting.add_metric([], queue_status(session).waiting)
        out.append(waiting)
        return out

    @staticmethod
    def _ingest_rate(session: Session) -> list[Metric]:
        rate = last_ingest_passages_per_s(session)
        if rate is None:
            return []
        g = GaugeMetricFamily(
            "sqa_ingest_passages_per_second",
            "Passages per second of the last succeeded ingest job (chunk, encode and commit)",
        )
        g.add_metric([], rate)
        return [g]

    @staticmethod
    def _jobs(session: Session) -> list[Metric]:
        g = GaugeMetricFamily("sqa_jobs", "Jobs in the jobs table, by kind and state", labels=["kind", "state"])
        for kind, state, n in session.execute(
            select(Job.kind, Job.state, func.count(Job.id)).group_by(Job.kind, Job.state)
        ).all():
            g.add_metric([kind, state], n)
        return [g]


def install(app: FastAPI, registry: CollectorRegistry) -> None:
    """Register the operator's metrics in the app's /metrics registry (app.state.answer_metrics)."""
    app.state.answer_metrics = AnswerMetrics(registry)
    registry.register(OperatorCollector(app))
