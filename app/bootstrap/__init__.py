"""Wiring on top: build the database, encoder, reader, index state, services and the jobs' context
from the settings.

Only the entry points call this module: the HTTP app (app/main.py), the CLI (app/cli/) and the
scheduler's job functions below (`scheduled_monthly_ingest`, `scheduled_quarterly_evaluation`,
`scheduled_weekly_adaptation`, which the job store names by textual reference). Nothing below it
reads the settings: jobs get a `JobContext`, services and libraries get plain values.

The serving objects are built in app.bootstrap.builders and the jobs' and loops' configs in
app.bootstrap.job_configs; this module holds the jobs' context, the scheduler's job functions and
the worker process (`sqa worker`).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from app.bootstrap.builders import (
    build_answer_service,
    build_encoder,
    build_reader,
    build_retriever,
    export_trained_folder,
    index_state,
    load_trained_folder,
    open_database,
)
from app.bootstrap.job_configs import (
    drift_config,
    eval_config,
    feed_config,
    inbox_config,
    ingest_config,
    live_config,
    nats_config,
    scheduler_config,
    transport_config,
)
from models.encoders import TextEncoder
from models.readers import Reader
from serving.answering import AnswerService
from serving.reader_registry import READER_TRAINING_LOCK
from serving.reranking import active_reranker
from settings import Settings, get_settings
from store.engine import Database
from workers.config import AutoTrainConfig
from workers.feed_poller import FeedPoller
from workers.inbox import InboxWatcher
from workers.ingest import ingest_lock
from workers.job_context import JobContext
from workers.live_publisher import LivePublisher
from workers.nats_consumer import NatsConsumer
from workers.runner import JobRunner
from workers.scheduled import (
    MONTHLY_INGEST,
    QUARTERLY_EVALUATION,
    WEEKLY_ADAPTATION,
    monthly_ingest,
    quarterly_evaluation,
    weekly_adaptation,
)
from workers.scheduler import run_worker as run_scheduler

log = logging.getLogger(__name__)


# ---- the jobs' context -----------------------------------------------------------------------------


def show_bars() -> bool:
    """Draw progress bars on a terminal, or anywhere with SQA_PROGRESS=1."""
    return sys.stderr.isatty() or os.environ.get("SQA_PROGRESS") == "1"


def retriever_key(settings: Settings, *, rerank: bool = True) -> str:
    """SQA_RETRIEVER with the fusion settings that change its ranking ("hybrid-weighted-0.5"), then
    the re-ranker version serving at the time of the call ("...+reranker-2023-04-01-915bca";
    `rerank=False`: the first stage alone)."""
    key = settings.retriever
    if settings.retriever == "hybrid":
        key = f"hybrid-{settings.fusion}-{settings.fusion_dense_weight}"
        if settings.recency_weight:
            key += f"-recency-{settings.recency_weight:g}"
    active = active_reranker(settings.rerankers_dir) if rerank and settings.reranker == "auto" else None
    return f"{key}+{active}" if active else key


def build_context(
    settings: Settings,
    db: Database,
    *,
    bar: bool = False,
    encoder: TextEncoder | None = None,
    answer_service: AnswerService | None = None,
) -> JobContext:
    """The context jobs run in. `encoder` and `answer_service`: what a server already loaded (else
    they load on first use, once)."""

    @functools.cache
    def load_encoder() -> TextEncoder:
        return encoder if encoder is not None else build_encoder(settings)

    def load_answer_service(reader: Reader | None = None) -> AnswerService:
        if answer_service is not None and reader is None:
            return answer_service
        return build_answer_service(settings, db, load_encoder(), reader or build_reader(settings, db))

    return JobContext(
        db=db,
        runner=JobRunner(db.sessions, settings.work_dir / "jobs", bar=bar),
        home=settings.home,
        index_dir=settings.index_dir,
        work_dir=settings.work_dir,
        models_dir=settings.models_dir,
        encoders_dir=settings.encoders_dir,
        rerankers_dir=settings.rerankers_dir,
        reports_dir=settings.reports_dir,
        device=settings.device,
        reader=settings.reader,
        retriever=retriever_key(settings, rerank=False),
        served_retriever=lambda: retriever_key(settings),
        news_source=settings.news_source,
        finetune_policy=settings.finetune_policy,
        drift_measure=settings.drift_measure,
        drift_drop_threshold=settings.drift_drop_threshold,
        ingest=ingest_config(settings),
        evaluation=eval_config(settings),
        transport=transport_config(settings),
        drift=drift_config(settings),
        auto_train=AutoTrainConfig(
            enabled=settings.auto_train,
            max_minutes=settings.auto_train_minutes,
            seeds=settings.auto_train_seeds,
            rerank=settings.auto_train_reranker and settings.reranker != "none",
            reranker_kind=settings.auto_train_reranker_kind,
            reranker_depth=settings.rerank_depth,
            adapt_days=settings.adapt_days,
            context_words=settings.reader_context_words,
        ),
        load_encoder=load_encoder,
        load_answer_service=load_answer_service,
        open_index_state=lambda enc, lexical: index_state(settings, db, enc, lexical=lexical),
        make_retriever=lambda enc, rerank=True: build_retriever(settings, enc, rerank=rerank),
        load_reader_folder=lambda folder: load_trained_folder(settings, Path(folder)),
        train_precision=settings.train_precision,
        export_reader_folder=lambda folder: export_trained_folder(settings, Path(folder)),
    )


@contextlib.contextmanager
def open_context(settings: Settings, *, migrate: bool = True, bar: bool = False) -> Iterator[JobContext]:
    """An entry point's database and job context, closed together (`with open_context(s) as ctx`)."""
    db = open_database(settings, migrate=migrate)
    try:
        yield build_context(settings, db, bar=bar)
    finally:
        db.close()


# ---- the scheduler's job functions (the job store names them: "app.bootstrap:scheduled_...") -----------


def scheduled_monthly_ingest(month: str | None = None) -> dict:
    """The monthly ingest as the scheduler runs it: the context from the settings, then the job."""
    settings = get_settings()
    with open_context(settings) as ctx:  # every worker runs it; one does, the others wait and skip
        return monthly_ingest(ctx, month, wait_s=settings.misfire_grace_s)


def scheduled_weekly_adaptation(cut: str | None = None) -> dict:
    """The weekly adaptation as the scheduler runs it."""
    settings = get_settings()
    with open_context(settings) as ctx:
        return weekly_adaptation(ctx, cut, wait_s=settings.misfire_grace_s)


def scheduled_quarterly_evaluation(quarter: str | None = None) -> dict:
    """The quarterly evaluation as the scheduler runs it."""
    settings = get_settings()
    with open_context(settings) as ctx:
        return quarterly_evaluation(ctx, quarter, wait_s=settings.misfire_grace_s)


# ---- the scheduler process (`sqa worker`) --------------------------------------------------------------


def job_locks(settings: Settings, runner: JobRunner) -> dict:
    """The lock each kind of job holds while it runs (for `JobRunner.recover` at start-up)."""
    from workers.train_retriever import RETRIEVER_TRAINING_LOCK  # noqa: PLC0415 (lazy: workers.train_retriever imports torch)

    ingest = ingest_lock(settings.index_dir)
    return {
        "ingest": ingest,
        "reencode": ingest,
        "train": runner.lock(READER_TRAINING_LOCK),
        "finetune": runner.lock(READER_TRAINING_LOCK),
        "train-retriever": runner.lock(RETRIEVER_TRAINING_LOCK),
        MONTHLY_INGEST: runner.lock(MONTHLY_INGEST),
        QUARTERLY_EVALUATION: runner.lock(QUARTERLY_EVALUATION),
        WEEKLY_ADAPTATION: runner.lock(WEEKLY_ADAPTATION),
    }


def run_worker(settings: Settings) -> None:
    """`sqa worker`: migrate, mark the jobs a dead process left running as interrupted, then run the
    scheduler until SIGTERM (workers.scheduler.run_worker)."""
    db = open_database(settings)  # migrations first: the jobs table exists before any run
    if db.engine.dialect.name == "sqlite":
        log.warning(
            "SQLite: the workers of this SQA_HOME take turns through file locks under %s, on this "
            "machine only; workers on several machines need PostgreSQL (SQA_DATABASE_URL), whose advisory "
            "locks let each scheduled run execute once among them",
            settings.work_dir / "jobs",
        )
    try:
        runner = JobRunner(db.sessions, settings.work_dir / "jobs")
        n = runner.recover(job_locks(settings, runner))
        if n:
            log.info("marked %d job(s) left running by a stopped process as interrupted", n)
    finally:
        db.close()
    live_db = open_database(settings, migrate=False)
    try:
        run_scheduler(scheduler_config(settings), services=worker_services(settings, live_db))
    finally:
        live_db.close()


def worker_services(settings: Settings, db: Database) -> list:
    """The live loops `sqa worker` runs beside its scheduler (SQA_LIVE): the publisher of the live
    queue, the feed poller and, with SQA_NEWS_SOURCE=inbox:PATH, the inbox watcher; with SQA_NATS_URL,
    the NATS JetStream consumer."""
    if not settings.live:
        return []
    encoder = functools.cache(lambda: build_encoder(settings))
    services: list = [
        LivePublisher(db.sessions, encoder, ingest_config(settings), live_config(settings)),
        FeedPoller(db.sessions, feed_config(settings)),
    ]
    kind, _, where = settings.news_source.partition(":")
    if kind == "inbox" and where:
        services.append(InboxWatcher(db.sessions, inbox_config(settings, Path(where).expanduser())))
    if settings.nats_url:
        services.append(NatsConsumer(db.sessions, nats_config(settings)))
    return services
