"""The one Settings object. Field names are the environment variables, prefixed SQA_.

A leaf of the layers: it imports nothing of the project, and every layer may read it (the
drift feature kinds and measures are spelled here, once). The entry points (app/) build the
Settings object and pass plain values and configs down; the layers below take those, not the
Settings object.
"""

from __future__ import annotations

import os
import re
import secrets
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


@dataclass(frozen=True)
class ReaderSpec:
    """SQA_READER taken apart.

    kind: "builtin" (a packaged reader or fake, by name: load_reader checks the name), "auto" (the
    active registry version, else the packaged Gemma), "path" (a trained version's folder) or "version" (a
    registered version by name). `expect` is the reader kind a "fid:"/"extractive:"/"ranker:"/"gemma:" path
    must hold.
    """

    kind: Literal["builtin", "auto", "path", "version"]
    value: str
    expect: str | None = None

    @property
    def follows_registry(self) -> bool:
        return self.kind == "auto"


_READER_PATH_PREFIXES = ("fid", "extractive", "ranker", "gemma", "trained")

# The drift features and measures (evaluation/drift.py computes them): spelled here once, since the
# settings are the leaf every layer reads.
DRIFT_FEATURE_KINDS = ("words", "entities")
# Every measure evaluation.drift.drift_between can return, in a stable order (unseen_entities* only
# when both sides were profiled with entities).
DriftMeasure = Literal[
    "unseen_words", "unseen_words_tokens", "unseen_entities", "unseen_entities_tokens", "cosine", "kl"
]
DRIFT_MEASURES: tuple[str, ...] = typing.get_args(DriftMeasure)


def parse_drift_features(value: str | Iterable[str]) -> tuple[str, ...]:
    """'entities, words' (or an iterable of kinds) -> ('words', 'entities'), in DRIFT_FEATURE_KINDS
    order.

    Raises:
        ValueError naming the unknown kind, or when no kind is given.
    """
    items = value.split(",") if isinstance(value, str) else list(value)
    kinds = {k.strip().lower() for k in items if k and k.strip()}
    unknown = sorted(kinds - set(DRIFT_FEATURE_KINDS))
    if unknown:
        raise ValueError(
            f"drift feature {unknown[0]!r} is unknown (use {' and/or '.join(DRIFT_FEATURE_KINDS)}, comma-separated)"
        )
    if not kinds:
        raise ValueError(f"no drift features given (use {' and/or '.join(DRIFT_FEATURE_KINDS)})")
    return tuple(k for k in DRIFT_FEATURE_KINDS if k in kinds)


def parse_reader_spec(spec: str) -> ReaderSpec:
    """'auto', 'gemma', 'fid:/models/v1', 'version:fid-2023-03-31-1a2b3c' -> ReaderSpec.

    Raises ValueError naming the setting for a malformed spec or a path that is not a folder.
    """
    value = (spec or "").strip()
    if not value:
        raise ValueError(
            "SQA_READER is empty (use gemma, first-entity, auto, fid:PATH, extractive:PATH, "
            "trained:PATH or version:NAME)"
        )
    if value == "auto":
        return ReaderSpec("auto", value)
    prefix, sep, rest = value.partition(":")
    if not sep:
        return ReaderSpec("builtin", value)
    rest = rest.strip()
    if prefix == "version":
        if not rest:
            raise ValueError("SQA_READER=version: needs a version name (see `sqa models list`)")
        return ReaderSpec("version", rest)
    if prefix in _READER_PATH_PREFIXES:
        path = Path(rest).expanduser().resolve() if rest else None
        if path is None or not path.is_dir():
            raise ValueError(
                f"SQA_READER={value}: {rest or '(empty path)'} is not a folder (give the folder of a "
                "trained reader version, the one holding reader.json)"
            )
        return ReaderSpec("path", str(path), expect=None if prefix == "trained" else prefix)
    raise ValueError(
        f"SQA_READER={value!r} is not understood (use gemma, first-entity, auto, fid:PATH, "
        "extractive:PATH, trained:PATH or version:NAME)"
    )


SECRETS_DIR = "/run/secrets"


class Settings(BaseSettings):
    # Secrets may come as files (Docker/Compose secrets): /run/secrets/sqa_admin_token,
    # /run/secrets/sqa_database_url; the environment wins over a file.
    model_config = SettingsConfigDict(
        env_prefix="SQA_", extra="ignore", secrets_dir=SECRETS_DIR if os.path.isdir(SECRETS_DIR) else None
    )

    # "production" refuses to start without an admin token and marks cookies Secure.
    env: Literal["development", "production", "test"] = "development"
    # All state lives under one directory: database file, index shards, snapshots, job work files.
    home: Path = Path(".sqa")
    # Empty means the embedded default, sqlite:///<home>/sqa.db.
    database_url: str = ""
    # The X-Admin-Token the admin routes and the dashboard take; empty: the admin routes answer 403.
    admin_token: str = ""

    # Question and passage encoder: "auto" (the encoder the serving index was built with, the
    # packaged MiniLM for a new index; the server follows `sqa index reencode` switches), "minilm"
    # (the packaged all-MiniLM-L6-v2), a trained version's name (`sqa train retriever`, a folder
    # under <home>/encoders), a local sentence-transformers folder, or "hash" (a deterministic fake
    # for tests; "hash:delay_ms=5" slows it down so a test can kill an ingest half-way). Anything
    # but "auto" pins it: an index built with another encoder is refused.
    encoder: str = "auto"
    # Reader backend: "gemma" (the packaged Gemma 3 270M), "first-entity" (a deterministic fake that
    # copies a capitalised phrase from the top passage), "auto" (the active trained version in the
    # registry, else gemma; the server follows activations), a trained
    # version's folder "fid:PATH" / "extractive:PATH" / "ranker:PATH" / "gemma:PATH" / "trained:PATH", or
    # "version:NAME" (a registered version, whether active or not). Only "auto" follows activations.
    reader: str = "auto"
    # Where the encoder and the readers run: auto (a CUDA GPU when torch sees one, else the CPU), cpu,
    # cuda or cuda:N. Resolved when a model loads (app.bootstrap.builders.resolve_device), never at import.
    device: str = "auto"
    torch_threads: int = Field(default=0, ge=0)  # 0: torch's default
    # What runs the encoder's model on the CPU: torch, or ONNX Runtime with float or int8 weights
    # (models/onnx_encoder.py; exported once into ~/.cache/sqa/onnx). On a GPU it is always torch.
    # onnx-int8 by default: 1.9x torch's passages/s on the slice at the same recall@20
    # (bench/bench_encoder.py: 41.7 against 41.5).
    encoder_backend: Literal["torch", "onnx", "onnx-int8"] = "onnx-int8"

    top_k: int = Field(default=5, ge=1, le=100)
    max_top_k: int = Field(default=50, ge=1, le=1000)
    reader_passages: int = Field(default=0, ge=0, le=100)  # 0: the reader's own number
    # Gemma's context: 0 reads the first 100 words of each passage; N the sentences of the passages that
    # bear on the question, N words in all (models/reader_context.py): how the packaged Gemma reads, and
    # how a Gemma training reads (its version keeps it: SQA_READER_CONTEXT_WORDS does not change a version).
    reader_context_words: int = Field(default=0, ge=0, le=2000)
    # Gemma readers (packaged or trained): 1 decodes greedily; N keeps N beams and answers with the
    # best one the passages read contain (models.reader_base.grounded), else the best beam.
    reader_answer_beams: int = Field(default=1, ge=1, le=16)
    # Gemma readers, greedy: when the answer is only words of the question ("Latvia" for "Which
    # country will send troops to Latvia?"), N beams are searched and the best grounded answer that is
    # not an echo wins (models.gemma.GemmaReader); 0 keeps the echo.
    reader_echo_beams: int = Field(default=0, ge=0, le=16)
    # Gemma readers, greedy: "read" writes the answer with the words of the passages read and the
    # question only (models.gemma_decoding.greedy_within: each token then skips the 262k-word output head);
    # "full" may use any token.
    reader_vocabulary: Literal["full", "read"] = "full"
    # Votes across passages (models/voting.py): besides its reading of its passages together, the
    # reader reads each of the first N passages alone, and the answer whose readings' confidences add
    # up highest wins (the joint reading counts twice). N more generations an answer; 0: off.
    reader_vote: int = Field(default=0, ge=0, le=20)
    # Answers rewritten to the forms the quizzes write (models/answer_forms.py), learned from the
    # answers and choices of the questions asked before the serving reader's training cut: "expand"
    # ("Biden" -> "Joe Biden" where a passage read says it), "contract" (also "President Joe Biden" ->
    # "Joe Biden"), "off".
    answer_forms: Literal["off", "expand", "contract"] = "off"
    # Gemma readers' number format: "auto" is bfloat16 where the device computes it natively (a CPU
    # with AVX512-BF16 or AMX, a recent GPU), else float32 (models.gemma_weights.resolve_precision).
    reader_precision: Literal["auto", "float32", "bfloat16"] = "auto"
    # What runs a Gemma reader: "torch", "llama.cpp" (llama-cpp-python over GGUF files exported once:
    # the packaged base's into its cache dir, a trained version's into its folder; models/gemma_gguf.py),
    # or "auto": llama.cpp on a CPU without native bfloat16 (there PyTorch's bfloat16 is faster) when
    # it is installed, the decoding is greedy over the full vocabulary and the base is the packaged
    # model (models/gemma_llama.py).
    reader_runtime: Literal["auto", "torch", "llama.cpp"] = "auto"
    # The weight type of the decoder's tensors in a Gemma reader's file for llama.cpp (the token
    # embedding stays as shipped): "auto" is bf16 on a CPU with native bfloat16, else f32 (as fast
    # as q8_0 on AVX2, and PyTorch's answers; models.gemma_gguf.resolve_weight_type). q8_0 is
    # refused on a CPU with AMX, where llama.cpp's kernels for it crash the process.
    reader_gguf_type: Literal["auto", "q8_0", "bf16", "f16", "f32"] = "auto"
    # Gemma trainings' number format (every job that trains or fine-tunes one): "auto" trains under
    # bfloat16 autocast on a GPU with bfloat16 and on every CPU oneDNN computes it on, natively or
    # emulated on AVX-512 (models.gemma_weights.resolve_training_precision); "float32" trains in float32.
    train_precision: Literal["auto", "float32", "bfloat16"] = "auto"
    max_question_chars: int = Field(default=1000, ge=10)
    # Logs: "text" lines or one JSON object a line ("json", for a log shipper); both carry request ids.
    log_format: Literal["text", "json"] = "text"
    # Answers computed at once per process, more waiting their turn (first come, first served), and
    # the most a question may take in the server, waiting plus answering, before a 503 with
    # Retry-After (serving/admission.py). One at a time: the Gemma reader reads one prompt at a
    # time on every core anyway, so a second place only queued behind it. 4.5 s leaves half a second
    # of a 5 s budget to the network and the client (8 clients on the server's 2 cores: 0.3 s).
    answer_concurrency: int = Field(default=1, ge=1, le=256)
    # Concurrent questions whose readings go through the reader in one call at most, gathered for at
    # most SQA_READER_BATCH_WAIT_MS while more are still retrieving (serving/reader_batching.py; 1:
    # each alone). Only a greedy Gemma reader on PyTorch batches; it takes SQA_ANSWER_CONCURRENCY
    # above 1 for questions to be in flight together.
    reader_batch: int = Field(default=1, ge=1, le=64)
    reader_batch_wait_ms: float = Field(default=20, ge=0, le=1000)
    answer_queue: int = Field(default=8, ge=0, le=10_000)
    answer_wait_s: float = Field(default=4.5, ge=0, le=3600)
    # Answers kept per process for a question asked again over the same snapshot and models (0: none).
    answer_cache: int = Field(default=1024, ge=0, le=1_000_000)
    # A request body over this many bytes is refused (413) before it is read whole.
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    # Requests per client address (limits' notation, "" for none); health checks and /metrics are exempt.
    rate_limit: str = "600/minute"
    # Failed admin logins per client address before it is locked out (429) for the rest of the window.
    admin_failure_limit: str = "10/minute"
    # Where those counts live (a `limits` storage URI): memory:// (each process its own) or
    # redis://HOST:6379 (needs the redis package: pip install .[scale]), shared by API replicas.
    limits_storage: str = "memory://"
    # Passages per encoder batch; 0: the encoder's own choice, 8 on a CPU (the fastest here, with
    # either backend: bench/bench_encoder.py) and 128 on a GPU.
    encode_batch_size: int = Field(default=0, ge=0)
    # Passages per embedding checkpoint: an interrupted ingest resumes from the last one.
    checkpoint_every: int = Field(default=256, ge=1)
    # How often the API checks the database for a newer index snapshot (seconds; 0 = never).
    snapshot_poll_s: float = Field(default=5.0, ge=0)
    # On shutdown the server waits this long for the jobs it runs in the background (an ingest
    # finishing its swap) before it closes the database; a job still running after that is
    # marked interrupted at the next start, and resumes when run again.
    shutdown_wait_s: float = Field(default=30.0, ge=0)

    # --- retrieval and shard index types (serving/retrieval.py, indexer/ivf.py) ---
    # What /v1/answers retrieves with: dense (FAISS), bm25 (per-shard BM25) or hybrid (both, fused;
    # the default: it measures best on the RealTimeQA questions of 2023-01..06, README "Retrievers").
    retriever: Literal["dense", "bm25", "hybrid"] = "hybrid"
    # How hybrid fuses the two rankings: rrf (reciprocal rank) or weighted (min-max normalised scores).
    fusion: Literal["rrf", "weighted"] = "weighted"
    fusion_dense_weight: float = Field(default=0.5, ge=0.0, le=1.0)  # weighted: dense share, BM25 gets the rest
    # hybrid: a soft prior for recent news, score - weight * log1p(age in days at as_of) on the fused
    # score (weighted fusion scores are in [0, 1]); fitted on 2023-01..03 (bench/bench_quality.py). 0: none.
    recency_weight: float = Field(default=0.0, ge=0.0)
    # Re-ranking the first stage's top SQA_RERANK_DEPTH candidates (30 pairs cost ~2 s on 2 CPU cores)
    # with a cross-encoder version (serving/reranking.py): "auto" serves the active version (none
    # until `sqa train reranker` or the training after ingest activates one), "none" never re-ranks.
    reranker: Literal["auto", "none"] = "auto"
    rerank_depth: int = Field(default=30, ge=1, le=500)
    # Distinct evidence (serving/distinct.py): after ranking, a candidate most of whose word 5-grams
    # (this share of the shorter passage's) occur in a better-ranked one is the same story again (one
    # article under several URLs, a wire copy): the group is one passage, its freshest copy. 0: off.
    distinct_evidence: float = Field(default=0.0, ge=0.0, le=1.0)
    # A new shard is flat (exact) below ivf_min_vectors, IVF-Flat below ivf_compressed_min_vectors,
    # and IVF with ivf_codec codes (sq8: 8-bit scalar, pq: product quantisation) from there.
    ivf_min_vectors: int = Field(default=100_000, ge=1)
    ivf_compressed_min_vectors: int = Field(default=1_000_000, ge=1)
    ivf_codec: Literal["sq8", "pq"] = "sq8"

    # --- the scheduler process (`sqa worker`) ---
    # Where monthly news comes from: "realtimeqa:/path/to/clone" or "inbox:/path/to/folder" (a folder of
    # article JSONL files, plain or .gz). Empty: the monthly ingest indexes what is already imported.
    news_source: str = ""
    # Cron expressions (UTC): monthly ingest of the month just ended; quarterly evaluation of the
    # quarter just ended.
    ingest_cron: str = "0 2 1 * *"
    eval_cron: str = "0 4 2 1,4,7,10 *"
    # The weekly adaptation (workers.scheduled.weekly_adaptation), for live news: a re-ranker and a
    # fine-tune of the serving reader on the news of the last adapt_days days, each activated only if
    # it beats what serves on those days. Empty (the default): not scheduled; "0 3 * * 1" runs it
    # every Monday at 03:00 UTC. `sqa jobs run weekly-adaptation` runs it once.
    adapt_cron: str = ""
    adapt_days: int = Field(default=7, ge=1, le=31)
    # A run missed while the worker was down still runs (once) if it is at most this late.
    misfire_grace_s: int = Field(default=6 * 3600, ge=1)
    # Train the reader after an ingest (`sqa ingest`, the monthly job, POST /admin/ingest) on what is dated before the
    # ingested month, and activate it if it answers better on the month before (workers/auto_train.py).
    auto_train: bool = True
    # The training budget of one such job, in minutes (the best checkpoint within it is kept).
    auto_train_minutes: float = Field(default=30.0, gt=0)
    # A first training (no version active yet) runs up to this many seeds while that budget has room
    # for another run, and checks their soup (docs/reader-experiments.md, "Two seeds and their soup
    # are the default"); 1 trains one run.
    auto_train_seeds: int = Field(default=2, ge=1, le=8)
    # ...and a re-ranker first (SQA_RERANKER=auto), activated only if it beats the first stage on the
    # held-back month. On by default since the feature re-ranker (below) trains in a minute on 2 cores
    # and lifted the trained reader's EM on the 353 questions of 2023-04..06 (README, "Re-ranking").
    auto_train_reranker: bool = True
    # Which re-ranker it trains: "features" (a logistic model over cheap question/passage features,
    # seconds to train; models/ltr.py) or "cross-encoder" (MiniLM reads each pair; wants a GPU).
    auto_train_reranker_kind: Literal["features", "cross-encoder"] = "features"
    # Also fine-tune the active reader on each ingest's (last) month: never | always | on-drift
    # (after the training SQA_AUTO_TRAIN does, which learns only what is dated before the month).
    finetune_policy: Literal["never", "always", "on-drift"] = "never"
    # on-drift: fine-tune when the drift regression (workers/version_transport.py) predicts that the new
    # month costs the active reader more than this many F1 points against its source quarter.
    drift_drop_threshold: float = Field(default=2.0, ge=0.0)
    # The drift measure the regression uses: cosine | kl | unseen_words | unseen_words_tokens | ...
    drift_measure: DriftMeasure = "cosine"
    # Evaluation: questions answered by the reader per quarter (0: all); retrieval metrics cover all.
    eval_max_questions: int = Field(default=0, ge=0)

    # --- live news (workers/live_publisher.py, feed_poller.py, inbox.py, nats_consumer.py) ---
    # Run the live loops in `sqa worker`: the publisher of pushed/polled articles, the feed poller,
    # with SQA_NEWS_SOURCE=inbox:PATH the inbox watcher and with SQA_NATS_URL the NATS consumer.
    # Off: news waits for the monthly ingest.
    live: bool = True
    # Publish the live queue as soon as this many articles wait, or once the oldest has waited
    # SQA_LIVE_MAX_WAIT_S seconds; at most SQA_LIVE_MAX_BATCH articles a snapshot.
    live_batch_articles: int = Field(default=32, ge=1)
    live_max_wait_s: float = Field(default=5.0, ge=0)
    live_max_batch: int = Field(default=256, ge=1, le=100_000)
    # A month's live pieces are merged into one when it has this many (a search fans out over them).
    live_merge_pieces: int = Field(default=8, ge=2, le=1000)
    live_poll_s: float = Field(default=1.0, gt=0)
    # POST /admin/articles: the largest body, and the largest text of one article (characters).
    max_articles_body_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_article_chars: int = Field(default=200_000, ge=100)
    # The inbox watcher looks for new or grown files this often (seconds).
    inbox_poll_s: float = Field(default=10.0, gt=0)
    # Feeds: each is fetched every SQA_FEED_INTERVAL_S (conditional GET), one host at most every
    # SQA_FEED_HOST_DELAY_S; a request times out after SQA_FEED_TIMEOUT_S and is retried
    # SQA_FEED_RETRIES times with exponential backoff; bodies over SQA_FEED_MAX_BYTES are refused.
    feed_interval_s: float = Field(default=300.0, gt=0)
    feed_host_delay_s: float = Field(default=2.0, ge=0)
    feed_timeout_s: float = Field(default=20.0, gt=0)
    feed_retries: int = Field(default=3, ge=0, le=10)
    feed_max_bytes: int = Field(default=5 * 1024 * 1024, ge=1024)
    # NATS JetStream (workers/nats_consumer.py): with a URL (nats://127.0.0.1:4222) the worker consumes
    # the subject's messages (the POST /admin/articles body) and acknowledges each once it is stored.
    nats_url: str = ""
    nats_subject: str = "sqa.articles"
    nats_stream: str = "SQA_ARTICLES"
    nats_durable: str = "sqa-worker"

    # --- drift of each new month (evaluation/drift.py) ---
    # Compute a month's drift (against the previous, earlier and training months) after its ingest.
    drift_on_ingest: bool = True
    # Lexical features: "words", or "words,entities" (spaCy NER, about 75 passages/s: a minute per month).
    drift_features: str = "words"

    @field_validator("home")
    @classmethod
    def _home_absolute(cls, v: Path) -> Path:
        return v.expanduser().resolve()

    @field_validator("rate_limit", "admin_failure_limit")
    @classmethod
    def _limit(cls, v: str, info: ValidationInfo) -> str:
        v = v.strip()
        if not v and info.field_name == "rate_limit":
            return v
        from limits import parse  # noqa: PLC0415 (lazy: limits, 0.1 s; `sqa --help` imports settings)

        try:
            parse(v)
        except ValueError:
            raise ValueError(f"{v!r} is not a rate (use N/second, N/minute, N/hour, e.g. 600/minute)") from None
        return v

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        v = v.strip().lower()
        if v in ("auto", "cpu", "cuda") or re.fullmatch(r"cuda:\d+", v):
            return v
        raise ValueError(f"device {v!r} is not auto, cpu, cuda or cuda:N")

    @field_validator("reader")
    @classmethod
    def _reader_spec(cls, v: str) -> str:
        parse_reader_spec(v)  # refuses a malformed spec or a missing folder now, not at the first question
        return v.strip()

    @field_validator("drift_features")
    @classmethod
    def _drift_features(cls, v: str) -> str:
        return ",".join(parse_drift_features(v))

    @model_validator(mode="after")
    def _check(self) -> Settings:
        if self.env == "production" and not self.admin_token:
            raise ValueError(
                "SQA_ADMIN_TOKEN must be set when SQA_ENV=production "
                f"(for example: export SQA_ADMIN_TOKEN={secrets.token_urlsafe(24)})"
            )
        if self.top_k > self.max_top_k:
            raise ValueError(f"SQA_TOP_K={self.top_k} is larger than SQA_MAX_TOP_K={self.max_top_k}")
        return self

    @model_validator(mode="after")
    def _check_shard_policy(self) -> Settings:
        if self.ivf_compressed_min_vectors < self.ivf_min_vectors:
            raise ValueError(
                f"SQA_IVF_COMPRESSED_MIN_VECTORS={self.ivf_compressed_min_vectors} is below "
                f"SQA_IVF_MIN_VECTORS={self.ivf_min_vectors}"
            )
        return self

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.home / 'sqa.db'}"

    @property
    def index_dir(self) -> Path:
        return self.home / "index"

    @property
    def reports_dir(self) -> Path:
        return self.home / "reports"

    @property
    def work_dir(self) -> Path:
        return self.home / "work"

    @property
    def models_dir(self) -> Path:
        """Trained reader versions, one folder each (`reader_models.path` is relative to it)."""
        return self.home / "models"

    @property
    def encoders_dir(self) -> Path:
        """Trained retriever encoder versions, one folder each (`sqa train retriever`)."""
        return self.home / "encoders"

    @property
    def rerankers_dir(self) -> Path:
        """Trained re-ranker versions, one folder each, and the ACTIVE file (`sqa train reranker`)."""
        return self.home / "rerankers"

    @property
    def drift_dir(self) -> Path:
        """Month profiles for the drift measures (profiles/<month>.npz and .json.gz)."""
        return self.home / "drift"

    @property
    def reader_spec(self) -> ReaderSpec:
        return parse_reader_spec(self.reader)

    def ensure_dirs(self) -> None:
        for d in (self.home, self.index_dir, self.work_dir, self.models_dir):
            d.mkdir(parents=True, exist_ok=True)


@lru_cache
def get_settings() -> Settings:
    return Settings()
