"""Wiring on top: build the database, encoder, reader, index state, services and the jobs' context
from the settings.

Only the entry points call this module: the HTTP app (app/main.py), the CLI (app/cli/) and the
scheduler's job functions below (`scheduled_monthly_ingest`, `scheduled_quarterly_evaluation`,
which the job store names by textual reference). Nothing below it reads the settings: jobs get a
`JobContext`, services and libraries get plain values.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from indexer.ivf import ShardPolicy
from indexer.push import PushLimits
from models.encoders import TextEncoder, describe_encoder, load_encoder, resolve_encoder
from models.readers import Reader, load_reader
from serving.answering import AnswerLimits, AnswerService
from serving.index_state import IndexState
from serving.reader_registry import check_servable, get_version
from serving.reader_state import ReaderState, RegistrySource
from serving.reranking import RerankerState, RerankingRetriever, active_reranker
from serving.retrieval import Retriever, make_retriever
from settings import ReaderSpec, Settings, get_settings, parse_drift_features
from store.engine import Database, make_engine, make_session_factory
from store.engine import open_database as _open_url
from workers.config import (
    AutoTrainConfig,
    DriftConfig,
    EvalConfig,
    FeedConfig,
    InboxConfig,
    IngestConfig,
    LiveConfig,
    TransportConfig,
)
from workers.feed_poller import FeedPoller
from workers.inbox import InboxWatcher
from workers.job_context import JobContext
from workers.live_publisher import LivePublisher
from workers.runner import JobRunner

log = logging.getLogger(__name__)


def open_database(settings: Settings, *, migrate: bool = True) -> Database:
    """The settings' database (SQLite under SQA_HOME by default), migrated to the newest schema
    (app.cli.common has the same for the commands that need nothing else)."""
    settings.ensure_dirs()
    return _open_url(settings.db_url, migrate=migrate)


def configure_torch(settings: Settings) -> None:
    if settings.torch_threads:
        import torch

        torch.set_num_threads(settings.torch_threads)


def build_encoder(settings: Settings) -> TextEncoder:
    """SQA_ENCODER's encoder; with "auto", the one the serving index records (MiniLM for a new index)."""
    configure_torch(settings)
    if settings.encoder == AUTO_ENCODER:
        name = index_encoder_name(settings)
        if name is not None:
            return resolve_encoder(
                name,
                encoders_dir=settings.encoders_dir,
                device=resolve_device(settings),
                backend=settings.encoder_backend,
            )
        return load_encoder("minilm", device=resolve_device(settings), backend=settings.encoder_backend)
    return load_encoder(
        settings.encoder,
        device=resolve_device(settings),
        encoders_dir=settings.encoders_dir,
        backend=settings.encoder_backend,
    )


AUTO_ENCODER = "auto"


def encoder_identity(settings: Settings) -> tuple[str, int]:
    """SQA_ENCODER's (name, dim) as `build_encoder` would give them, read from the model's files where
    they tell (no torch, no weights: `sqa index status` starts in a second); built otherwise."""
    spec = settings.encoder
    if spec == AUTO_ENCODER:
        spec = index_encoder_name(settings) or "minilm"
    found = describe_encoder(spec, encoders_dir=settings.encoders_dir)
    if found is None:
        encoder = build_encoder(settings)
        found = (encoder.name, encoder.dim)
    return found


def index_encoder_name(settings: Settings) -> str | None:
    """The encoder the newest serving snapshot was built with, None while there is none."""
    from sqlalchemy import inspect

    from serving.index_state import latest_snapshot_row

    engine = make_engine(settings.db_url)
    try:
        if not inspect(engine).has_table("index_snapshots"):
            return None
        with make_session_factory(engine)() as session:
            row = latest_snapshot_row(session)
            return row.encoder if row is not None else None
    finally:
        engine.dispose()


class EncoderResolver:
    """Encoder by the name an index snapshot records, loaded once each (SQA_ENCODER=auto)."""

    def __init__(self, settings: Settings, *known: TextEncoder) -> None:
        self._settings = settings
        self._cache = {e.name: e for e in known}

    def __call__(self, name: str) -> TextEncoder:
        if name not in self._cache:
            self._cache[name] = resolve_encoder(
                name,
                encoders_dir=self._settings.encoders_dir,
                device=resolve_device(self._settings),
                backend=self._settings.encoder_backend,
            )
        return self._cache[name]


def index_state(settings: Settings, db: Database, encoder: TextEncoder, *, lexical: bool = False) -> IndexState:
    """The IndexState for `encoder`: pinned to it, or (SQA_ENCODER=auto) each snapshot with its own encoder."""
    resolver = EncoderResolver(settings, encoder) if settings.encoder == AUTO_ENCODER else None
    return IndexState(
        db.sessions, settings.index_dir, encoder=encoder.name, dim=encoder.dim, lexical=lexical, resolver=resolver
    )


FALLBACK_READER = "gemma"  # what SQA_READER=auto serves while no trained version is active


def load_builtin_reader(settings: Settings, name: str) -> Reader:
    """A packaged reader or fake by name; Gemma's converted weights are kept under SQA_HOME/models/base."""
    return load_reader(
        name,
        device=resolve_device(settings),
        max_passages=settings.reader_passages or 3,
        cache_dir=settings.models_dir / "base",
        context_words=settings.reader_context_words,
        answer_beams=settings.reader_answer_beams,
        vocabulary=settings.reader_vocabulary,
        precision=settings.reader_precision,
        echo_beams=settings.reader_echo_beams,
    )


def load_trained_folder(settings: Settings, folder: Path, *, expect: str | None = None) -> Reader:
    """The trained reader in a version folder; `expect` ("fid", "gemma", ...) must match its reader.json."""
    from models.trained import load_trained_reader, read_reader_info  # imported here: heavy, only when used

    if expect is not None:
        kind = read_reader_info(folder).get("kind")
        if kind != expect:
            raise ValueError(f"SQA_READER={expect}:{folder} but {folder / 'reader.json'} says kind {kind!r}")
    return load_trained_reader(
        folder,
        device=resolve_device(settings),
        max_passages=settings.reader_passages or None,
        answer_beams=settings.reader_answer_beams,
        vocabulary=settings.reader_vocabulary,
        precision=settings.reader_precision,
        echo_beams=settings.reader_echo_beams,
    )


def build_reader_state(settings: Settings, db: Database | None) -> ReaderState:
    """The serving reader SQA_READER names; with "auto" a state that follows the active version.

    `db` may be None only for specs that need no registry (built-in names and folders).
    """
    configure_torch(settings)
    spec: ReaderSpec = settings.reader_spec
    if spec.kind == "builtin":
        return ReaderState(load_builtin_reader(settings, spec.value))
    if spec.kind == "path":
        return ReaderState(load_trained_folder(settings, Path(spec.value), expect=spec.expect))
    if db is None:
        raise ValueError(f"SQA_READER={settings.reader} reads the reader registry: it needs the database")
    if spec.kind == "version":
        with db.sessions() as session:
            row = get_version(session, spec.value)  # NotFoundError
            folder = check_servable(row, settings.models_dir)  # ConflictError: not ready, folder missing
        return ReaderState(load_trained_folder(settings, folder), version=spec.value)
    state = ReaderState(
        source=RegistrySource(
            db.sessions,
            settings.models_dir,
            load_version=lambda folder: load_trained_folder(settings, folder),
            load_fallback=lambda: load_builtin_reader(settings, FALLBACK_READER),
        )
    )
    state.refresh()  # the active version, else the fallback; raises only if nothing can serve
    return state


def build_reader(settings: Settings, db: Database | None = None) -> Reader:
    """The reader SQA_READER names, resolved now (one-shot commands; the server keeps a ReaderState).

    "auto" and "version:NAME" read the registry: from `db`, or a database opened for the lookup.
    """
    if db is None and settings.reader_spec.kind in ("auto", "version"):
        db = open_database(settings)
        try:
            return build_reader_state(settings, db).reader()
        finally:
            db.close()
    return build_reader_state(settings, db).reader()


def drift_config(settings: Settings) -> DriftConfig:
    """SQA_DRIFT_FEATURES and SQA_DRIFT_ON_INGEST; profiles under SQA_HOME/drift/profiles."""
    return DriftConfig(
        profiles_dir=settings.drift_dir / "profiles",
        features=parse_drift_features(settings.drift_features),
        on_ingest=settings.drift_on_ingest,
        batch_size=settings.encode_batch_size or 64,
    )  # texts per spaCy batch


def transport_config(settings: Settings) -> TransportConfig:
    """Where drift profiles are and the drift measure the F1 regression uses (SQA_DRIFT_MEASURE)."""
    return TransportConfig(
        index_dir=settings.index_dir,
        profiles_dir=settings.drift_dir / "profiles",
        features=parse_drift_features(settings.drift_features),
        measure=settings.drift_measure,
    )


def eval_config(settings: Settings, max_questions: int | None = None) -> EvalConfig:
    """The evaluation settings: reader passages, questions per quarter (SQA_EVAL_MAX_QUESTIONS unless
    given) and the drift section of the reports."""
    return EvalConfig(
        reader_passages=settings.reader_passages,
        max_questions=settings.eval_max_questions if max_questions is None else max_questions,
        transport=transport_config(settings),
    )


def ingest_config(settings: Settings) -> IngestConfig:
    return IngestConfig(
        index_dir=settings.index_dir,
        work_dir=settings.work_dir,
        batch_size=settings.encode_batch_size,
        checkpoint_every=settings.checkpoint_every,
        drift=drift_config(settings),
        shard_policy=shard_policy(settings),
    )


def live_config(settings: Settings) -> LiveConfig:
    """SQA_LIVE_*: when the live publisher publishes."""
    return LiveConfig(
        batch_articles=settings.live_batch_articles,
        max_wait_s=settings.live_max_wait_s,
        max_batch=settings.live_max_batch,
        merge_pieces=settings.live_merge_pieces,
        poll_s=settings.live_poll_s,
    )


def feed_config(settings: Settings) -> FeedConfig:
    """SQA_FEED_*: how often and how politely feeds are polled; entries are checked like pushed articles."""
    return FeedConfig(
        interval_s=settings.feed_interval_s,
        host_delay_s=settings.feed_host_delay_s,
        timeout_s=settings.feed_timeout_s,
        retries=settings.feed_retries,
        max_bytes=settings.feed_max_bytes,
        poll_s=min(10.0, settings.feed_interval_s),
        limits=push_limits(settings),
    )


def push_limits(settings: Settings) -> PushLimits:
    """What one pushed article may hold (SQA_MAX_ARTICLE_CHARS)."""
    return PushLimits(max_text_chars=settings.max_article_chars)


def shard_policy(settings: Settings) -> ShardPolicy:
    """SQA_IVF_MIN_VECTORS, SQA_IVF_COMPRESSED_MIN_VECTORS and SQA_IVF_CODEC."""
    return ShardPolicy(
        ivf_min=settings.ivf_min_vectors, compressed_min=settings.ivf_compressed_min_vectors, codec=settings.ivf_codec
    )


@functools.cache
def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(settings: Settings) -> str:
    """SQA_DEVICE made concrete: "auto" is "cuda" when torch sees a GPU, else "cpu"."""
    if settings.device != "auto":
        return settings.device
    return "cuda" if _cuda_available() else "cpu"


def build_retriever(settings: Settings, encoder: TextEncoder, *, rerank: bool = True) -> Retriever:
    """The retriever the service answers with: SQA_RETRIEVER, SQA_FUSION, SQA_FUSION_DENSE_WEIGHT,
    SQA_RECENCY_WEIGHT, then the active re-ranker version (SQA_RERANKER; `rerank=False`: the first
    stage alone, what a re-ranker is trained on)."""
    first = make_retriever(
        settings.retriever,
        encoder,
        fusion=settings.fusion,
        dense_weight=settings.fusion_dense_weight,
        recency=settings.recency_weight,
    )
    if not rerank or settings.reranker == "none":
        return first
    return RerankingRetriever(first, reranker_state(settings), depth=settings.rerank_depth)


def reranker_state(settings: Settings) -> RerankerState:
    """Follows SQA_HOME/rerankers/ACTIVE; versions load on the SQA_DEVICE."""

    def load(folder: Path):
        from models.reranker import load_reranker

        return load_reranker(folder, device=resolve_device(settings))

    return RerankerState(settings.rerankers_dir, load, poll_s=max(settings.snapshot_poll_s, 0.5))


def build_answer_service(
    settings: Settings, db: Database, encoder: TextEncoder, reader: Reader | ReaderState | None = None
) -> AnswerService:
    """`reader`: a fixed Reader, a ReaderState, or None for the state SQA_READER names."""
    if reader is None:
        reader = build_reader_state(settings, db)
    state = index_state(settings, db, encoder, lexical=settings.retriever != "dense")  # SQA_RETRIEVER
    limits = AnswerLimits(
        default_top_k=settings.top_k,
        max_top_k=settings.max_top_k,
        reader_passages=settings.reader_passages,
        max_question_chars=settings.max_question_chars,
    )
    retriever = build_retriever(settings, encoder)
    return AnswerService(
        encoder=encoder,
        reader=reader,
        index_state=state,
        session_factory=db.sessions,
        limits=limits,
        retriever=retriever,
    )


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
        ),
        load_encoder=load_encoder,
        load_answer_service=load_answer_service,
        open_index_state=lambda enc, lexical: index_state(settings, db, enc, lexical=lexical),
        make_retriever=lambda enc, rerank=True: build_retriever(settings, enc, rerank=rerank),
        load_reader_folder=lambda folder: load_trained_folder(settings, Path(folder)),
        train_precision=settings.train_precision,
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
    from workers.scheduled import monthly_ingest

    settings = get_settings()
    with open_context(settings) as ctx:  # every worker runs it; one does, the others wait and skip
        return monthly_ingest(ctx, month, wait_s=settings.misfire_grace_s)


def scheduled_quarterly_evaluation(quarter: str | None = None) -> dict:
    """The quarterly evaluation as the scheduler runs it."""
    from workers.scheduled import quarterly_evaluation

    settings = get_settings()
    with open_context(settings) as ctx:
        return quarterly_evaluation(ctx, quarter, wait_s=settings.misfire_grace_s)


# ---- the scheduler process (`sqa worker`) --------------------------------------------------------------


def scheduler_config(settings: Settings):
    """SQA_INGEST_CRON, SQA_EVAL_CRON and SQA_MISFIRE_GRACE_S, with the job store's database (its
    folder made, for SQLite)."""
    from workers.config import SchedulerConfig

    settings.ensure_dirs()
    return SchedulerConfig(
        db_url=settings.db_url,
        ingest_cron=settings.ingest_cron,
        eval_cron=settings.eval_cron,
        misfire_grace_s=settings.misfire_grace_s,
    )


def job_locks(settings: Settings, runner: JobRunner) -> dict:
    """The lock each kind of job holds while it runs (for `JobRunner.recover` at start-up)."""
    from serving.reader_registry import READER_TRAINING_LOCK
    from workers.ingest import ingest_lock
    from workers.scheduled import MONTHLY_INGEST, QUARTERLY_EVALUATION
    from workers.train_retriever import RETRIEVER_TRAINING_LOCK

    ingest = ingest_lock(settings.index_dir)
    return {
        "ingest": ingest,
        "reencode": ingest,
        "train": runner.lock(READER_TRAINING_LOCK),
        "finetune": runner.lock(READER_TRAINING_LOCK),
        "train-retriever": runner.lock(RETRIEVER_TRAINING_LOCK),
        MONTHLY_INGEST: runner.lock(MONTHLY_INGEST),
        QUARTERLY_EVALUATION: runner.lock(QUARTERLY_EVALUATION),
    }


def run_worker(settings: Settings) -> None:
    """`sqa worker`: migrate, mark the jobs a dead process left running as interrupted, then run the
    scheduler until SIGTERM (workers.scheduler.run_worker)."""
    from workers.scheduler import run_worker as run_scheduler

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
    queue, the feed poller and, with SQA_NEWS_SOURCE=inbox:PATH, the inbox watcher."""
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
    return services


def inbox_config(settings: Settings, folder: Path) -> InboxConfig:
    return InboxConfig(folder=folder, state_file=settings.work_dir / "inbox-seen.json", poll_s=settings.inbox_poll_s)
