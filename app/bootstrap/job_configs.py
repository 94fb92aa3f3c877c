"""The settings as the plain configs the jobs and the worker's loops take (workers.config): drift,
transport, evaluation, ingest, live publishing, feeds, the inbox, the NATS consumer and the
scheduler, with what one pushed article may hold and the shard policy. Nothing below app.bootstrap
reads the settings.
"""

from __future__ import annotations

from pathlib import Path

from indexer.ivf import ShardPolicy
from indexer.push import PushLimits
from settings import Settings, parse_drift_features
from workers.config import (
    DriftConfig,
    EvalConfig,
    FeedConfig,
    InboxConfig,
    IngestConfig,
    LiveConfig,
    NatsConfig,
    SchedulerConfig,
    TransportConfig,
)


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


def nats_config(settings: Settings) -> NatsConfig:
    """SQA_NATS_URL, SQA_NATS_SUBJECT, SQA_NATS_STREAM and SQA_NATS_DURABLE; its status under the work dir."""
    return NatsConfig(
        url=settings.nats_url,
        status_file=settings.work_dir / "nats-status.json",
        subject=settings.nats_subject,
        stream=settings.nats_stream,
        durable=settings.nats_durable,
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


def scheduler_config(settings: Settings) -> SchedulerConfig:
    """SQA_INGEST_CRON, SQA_EVAL_CRON and SQA_MISFIRE_GRACE_S, with the job store's database (its
    folder made, for SQLite)."""
    settings.ensure_dirs()
    return SchedulerConfig(
        db_url=settings.db_url,
        ingest_cron=settings.ingest_cron,
        eval_cron=settings.eval_cron,
        adapt_cron=settings.adapt_cron,
        misfire_grace_s=settings.misfire_grace_s,
    )


def inbox_config(settings: Settings, folder: Path) -> InboxConfig:
    return InboxConfig(folder=folder, state_file=settings.work_dir / "inbox-seen.json", poll_s=settings.inbox_poll_s)
