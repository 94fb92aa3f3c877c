"""The jobs' configs: plain frozen dataclasses that the entry points build from the settings
(`app.bootstrap`) and hand to the jobs, through a `JobContext` or directly. A leaf of workers/: it
imports no job, so the context and every job can import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from indexer.ivf import ShardPolicy
from indexer.push import PushLimits

DEFAULT_MEASURE = "cosine"  # the drift measure transportability regresses on (SQA_DRIFT_MEASURE)


@dataclass(frozen=True)
class DriftConfig:
    """Where profiles live and which lexical features to count (from SQA_DRIFT_* via app.bootstrap)."""

    profiles_dir: Path
    features: tuple[str, ...] = ("words",)
    on_ingest: bool = True
    batch_size: int = 64  # texts per spaCy batch (entities)


@dataclass(frozen=True)
class TransportConfig:
    """Where the month profiles are and which drift measure the regression uses (from SQA_DRIFT_*)."""

    index_dir: Path
    profiles_dir: Path
    features: tuple[str, ...] = ("words",)
    measure: str = DEFAULT_MEASURE


@dataclass(frozen=True)
class EvalConfig:
    top_k: int = 20  # retrieval depth for recall
    reader_passages: int = 0  # 0: the reader's own number
    max_questions: int = 0  # questions per test quarter that the reader answers (0: all)
    seed: int = 0
    transport: TransportConfig | None = None  # adds drift and transportability to the report


@dataclass(frozen=True)
class IngestConfig:
    index_dir: Path
    work_dir: Path
    batch_size: int = 0  # passages per encoder batch; 0: the encoder's own choice
    checkpoint_every: int = 256  # passages per embedding checkpoint file
    keep_snapshots: int = 3  # older snapshots lose their files and passage rows
    drift: DriftConfig | None = None  # compute each new month's drift after its commit (None: never)
    shard_policy: ShardPolicy = ShardPolicy()  # flat or IVF by the shard's size (SQA_IVF_*)


@dataclass(frozen=True)
class AutoTrainConfig:
    enabled: bool = True  # SQA_AUTO_TRAIN
    max_minutes: float = 30.0  # SQA_AUTO_TRAIN_MINUTES: the reader's training budget
    rerank: bool = True  # train a re-ranker first (SQA_AUTO_TRAIN_RERANKER, with SQA_RERANKER=auto)
    reranker_minutes: float = 20.0  # its budget (one epoch is usually less)
    reranker_kind: str = "features"  # SQA_AUTO_TRAIN_RERANKER_KIND: "features" or "cross-encoder"
    reranker_depth: int = 30  # SQA_RERANK_DEPTH: it learns on the candidates it will re-rank when serving
    check_questions: int = 40  # held-back questions both readers answer
    seed: int = 0
    # SQA_AUTO_TRAIN_SEEDS: a first training runs up to this many times (seed, seed + 1, ...) while
    # the budget has room for another run as long as the runs so far took, and checks their soup
    seeds: int = 2
    # The period a new reader is checked on, ending the day before the cut: 0 the calendar month
    # before it (after a month's ingest), N the N days before it (the weekly adaptation's week,
    # SQA_ADAPT_DAYS), where a fine-tune also learns only that period's news.
    held_back_days: int = 0
    # The weekly adaptation's period (SQA_ADAPT_DAYS): it learns the news of these days before its
    # cut and is checked on them (workers.scheduled.weekly_adaptation sets held_back_days to it).
    adapt_days: int = 7
    # SQA_READER_CONTEXT_WORDS: a first Gemma training reads (and its version serves) the sentences of
    # its passages that bear on the question, this many words in all; 0 the first 100 words of each
    context_words: int = 0


@dataclass(frozen=True)
class LiveConfig:
    """When the publisher publishes (SQA_LIVE_*): as soon as `batch_articles` wait, or when the oldest
    has waited `max_wait_s`; at most `max_batch` articles a publish; a month's pieces merged at
    `merge_pieces`. `poll_s`: how often the loop looks at the queue."""

    batch_articles: int = 32
    max_wait_s: float = 5.0
    max_batch: int = 256
    merge_pieces: int = 8
    poll_s: float = 1.0


@dataclass(frozen=True)
class FeedConfig:
    """SQA_FEED_* (app/bootstrap/job_configs.py `feed_config`). `full_text_chars`: entry content shorter than this
    is taken for a summary and the article page is fetched. `poll_s`: how often the loop looks for
    due feeds (a feed just added waits at most this long)."""

    interval_s: float = 300.0
    host_delay_s: float = 2.0
    timeout_s: float = 20.0
    retries: int = 3
    max_bytes: int = 5 * 1024 * 1024
    user_agent: str = "streaming-qa feed poller"
    retry_backoff_s: float = 1.0  # the first retry waits this long, each next one twice as long
    max_backoff_s: float = 86_400.0  # a failing feed is still tried once a day
    full_text_chars: int = 400
    poll_s: float = 10.0
    limits: PushLimits = PushLimits()


@dataclass(frozen=True)
class InboxConfig:
    folder: Path
    state_file: Path  # what was read already: {file name: [size, mtime_ns]}
    poll_s: float = 10.0


@dataclass(frozen=True)
class NatsConfig:
    """The NATS JetStream consumer (workers/nats_consumer.py): a durable pull consumer `durable` on
    `stream`, which holds `subject` (the stream is made when missing). A message not acknowledged
    within `ack_wait_s` is delivered again; one that fails to store waits `retry_s` first."""

    url: str
    status_file: Path  # what the consumer last did, for GET /admin/live and the dashboard
    subject: str = "sqa.articles"
    stream: str = "SQA_ARTICLES"
    durable: str = "sqa-worker"
    batch: int = 64
    ack_wait_s: float = 60.0
    retry_s: float = 5.0
    poll_s: float = 1.0
    limits: PushLimits = PushLimits()


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's settings: its job store's database, the crons (SQA_INGEST_CRON,
    SQA_EVAL_CRON) and SQA_MISFIRE_GRACE_S."""

    db_url: str
    ingest_cron: str = "0 2 1 * *"
    eval_cron: str = "0 4 2 1,4,7,10 *"
    adapt_cron: str = ""  # SQA_ADAPT_CRON: the weekly adaptation; "" leaves it out
    misfire_grace_s: int = 21600
