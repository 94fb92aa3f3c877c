"""ORM tables. API schemas live in app/api/schemas.py, never here."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Date,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    text,
    true,
)
from sqlalchemy.orm import Mapped, mapped_column, relationship

from store.base import Base, UTCDateTime, utcnow


class Article(Base):
    __tablename__ = "articles"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(2048), unique=True)
    title: Mapped[str] = mapped_column(Text, default="")
    text: Mapped[str] = mapped_column(Text)
    published: Mapped[dt.date] = mapped_column(Date, index=True)
    source: Mapped[str] = mapped_column(String(64), default="")
    content_hash: Mapped[str] = mapped_column(String(64))
    imported_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    # Live intake (workers/live_publisher.py): a changed text is a new version of the article (its old passages
    # are retired from later snapshots); authors and language as the pushing client gave them.
    version: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    updated_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    authors: Mapped[list[str]] = mapped_column(JSON, default=list)
    language: Mapped[str] = mapped_column(String(16), default="")


class LiveQueueItem(Base):
    """An article version stored but not yet searchable: the live publisher's work list.

    Written in the transaction that stores the article (so an acknowledged article is never lost)
    and deleted in the transaction that records the snapshot holding its passages (by the live
    publisher, or by the month ingest that compacts its month).
    """

    __tablename__ = "live_queue"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    article_id: Mapped[int] = mapped_column(ForeignKey("articles.id", ondelete="CASCADE"), unique=True)
    version: Mapped[int] = mapped_column(Integer)
    month: Mapped[str] = mapped_column(String(7), index=True)  # "YYYY-MM" of the article's publication day
    queued_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    via: Mapped[str] = mapped_column(String(16), default="api")  # api | feed | inbox | nats


class Feed(Base):
    """An RSS or Atom feed the worker polls (workers/feed_poller.py): conditional GET state and its health."""

    __tablename__ = "feeds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    url: Mapped[str] = mapped_column(String(2048), unique=True)
    title: Mapped[str] = mapped_column(Text, default="")
    source: Mapped[str] = mapped_column(String(64), default="")  # the articles' source name
    active: Mapped[bool] = mapped_column(Boolean, default=True, server_default=true())
    etag: Mapped[str | None] = mapped_column(String(512), nullable=True)
    last_modified: Mapped[str | None] = mapped_column(String(128), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    last_fetch_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_ok_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    next_fetch_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    last_status: Mapped[int | None] = mapped_column(Integer, nullable=True)  # HTTP status; None before any fetch
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)  # consecutive failed polls (backoff)
    last_new: Mapped[int] = mapped_column(Integer, default=0)  # new or updated articles at the last fetch
    articles_total: Mapped[int] = mapped_column(Integer, default=0)


class Passage(Base):
    """A dated chunk of an article. Its FAISS id is (day_number(published) << 40) | id.

    Passages belong to one shard build (`build_id`); re-ingesting a month writes a new build and
    the old build's rows are deleted only once no kept snapshot refers to them, so a server still
    answering from the old snapshot can fetch their text.
    """

    __tablename__ = "passages"
    __table_args__ = (
        UniqueConstraint("build_id", "article_id", "ordinal"),
        {"sqlite_autoincrement": True},  # never reuse a primary key: it is part of the FAISS id
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    article_id: Mapped[int] = mapped_column(ForeignKey("articles.id", ondelete="CASCADE"), index=True)
    ordinal: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    published: Mapped[dt.date] = mapped_column(Date)
    faiss_id: Mapped[int] = mapped_column(BigInteger, unique=True)
    shard_key: Mapped[str] = mapped_column(String(32), index=True)
    build_id: Mapped[str] = mapped_column(String(64), index=True)

    article: Mapped[Article] = relationship(lazy="joined")


class Question(Base):
    __tablename__ = "questions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    qid: Mapped[str] = mapped_column(String(128), unique=True)
    text: Mapped[str] = mapped_column(Text)
    asked: Mapped[dt.date] = mapped_column(Date, index=True)
    answers: Mapped[list[str]] = mapped_column(JSON)
    choices: Mapped[list[str]] = mapped_column(JSON, default=list)
    subset: Mapped[str] = mapped_column(String(32), index=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class IndexSnapshot(Base):
    """A committed index state: the manifest file and what it holds.

    The newest row of kind "serving" serves. Rows of kind "quarter" are the index as it stood at
    the end of a quarter (`label` "2023Q1"), recorded by a replay for evaluation; they never serve
    and their files and passages are kept.
    """

    __tablename__ = "index_snapshots"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    snapshot_id: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    manifest_file: Mapped[str] = mapped_column(String(512))  # relative to the index directory
    manifest_sha256: Mapped[str] = mapped_column(String(64))
    encoder: Mapped[str] = mapped_column(String(256))
    dim: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(BigInteger)
    shard_keys: Mapped[list[str]] = mapped_column(JSON)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    kind: Mapped[str] = mapped_column(String(16), default="serving", server_default="serving", index=True)
    label: Mapped[str | None] = mapped_column(String(32), nullable=True)


class Job(Base):
    """Long work (ingest, later evaluation and fine-tuning): state, progress, counts, error."""

    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_kind_state", "kind", "state"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # queued -> running -> succeeded | failed | interrupted
    state: Mapped[str] = mapped_column(String(16), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")
    counts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    timings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    pid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class EvalRun(Base):
    """One evaluation: a quarter's questions against one or more index/model states."""

    __tablename__ = "eval_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # "quarterly" | "replay"
    # What the run covers and the settings that matter (reader, encoder, top_k, snapshots, window).
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    state: Mapped[str] = mapped_column(String(16), default="running")  # running | succeeded | failed
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    report_dir: Mapped[str | None] = mapped_column(String(512), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime, nullable=True)


class EvalResult(Base):
    """One question answered under one state: enough to recompute any analysis without answering again."""

    __tablename__ = "eval_results"
    __table_args__ = (UniqueConstraint("run_id", "question_id", "state_quarter"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("eval_runs.id", ondelete="CASCADE"), index=True)
    question_id: Mapped[int] = mapped_column(ForeignKey("questions.id", ondelete="CASCADE"))
    test_quarter: Mapped[str] = mapped_column(String(8))
    state_quarter: Mapped[str] = mapped_column(String(8))  # the quarter whose end state answered
    snapshot_id: Mapped[str] = mapped_column(String(64))
    subset: Mapped[str] = mapped_column(String(16))  # recent | past | unknown
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)  # None: retrieval only
    em: Mapped[float | None] = mapped_column(Float, nullable=True)
    f1: Mapped[float | None] = mapped_column(Float, nullable=True)
    recall: Mapped[float] = mapped_column(Float)  # a gold answer string in the top-k passages (0/1)
    days: Mapped[float | None] = mapped_column(Float, nullable=True)  # median days question - cited passages
    passages: Mapped[list[list[Any]]] = mapped_column(JSON, default=list)  # [[passage_id, "YYYY-MM-DD", score], ...]
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    # Whether a passage the reader read states the answer, and the reader's probability of it
    # (evaluation.trust); None when not read, for a reader that gives no confidence, and on the
    # rows of runs made before they were stored.
    grounded: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    confidence: Mapped[float | None] = mapped_column(Float, nullable=True)


class ReaderModel(Base):
    """A trained reader version: its folder under SQA_HOME/models, lineage, state and metrics.

    At most one row is active (a partial unique index guards it); with SQA_READER=auto the servers
    serve the active version. A fine-tune names the version it started from (`parent_version`) and
    the month of news it learnt (`month`).
    """

    __tablename__ = "reader_models"
    __table_args__ = (
        # At most one active row, enforced by the database even against concurrent activations.
        Index(
            "ix_reader_models_one_active",
            "active",
            unique=True,
            sqlite_where=text("active"),
            postgresql_where=text("active"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(16))  # fid | extractive | ranker | gemma
    path: Mapped[str] = mapped_column(String(512))  # relative to the models directory
    parent_version: Mapped[str | None] = mapped_column(String(64), nullable=True)
    trained_until: Mapped[dt.date | None] = mapped_column(Date, nullable=True)
    month: Mapped[str | None] = mapped_column(String(7), nullable=True)  # "YYYY-MM" for a fine-tune
    state: Mapped[str] = mapped_column(String(16), default="ready")  # training | ready | failed
    active: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class MonthDrift(Base):
    """How far a month's passages are from a reference set of months (evaluation/drift.py's measures).

    reference: "previous" (the latest ingested month before it), "earlier" (every ingested month
    before it) or "training" (the months the active trained reader was trained on, `reader_version`).
    One row per (month, reference): a recompute replaces it.
    """

    __tablename__ = "month_drift"
    __table_args__ = (UniqueConstraint("month", "reference"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    month: Mapped[str] = mapped_column(String(7))  # "YYYY-MM"
    reference: Mapped[str] = mapped_column(String(16))  # previous | earlier | training
    reference_first: Mapped[str] = mapped_column(String(7))
    reference_last: Mapped[str] = mapped_column(String(7))
    reader_version: Mapped[str | None] = mapped_column(String(64), nullable=True)  # "training" rows only
    encoder: Mapped[str] = mapped_column(String(256))
    n_target: Mapped[int] = mapped_column(Integer)  # passages of the month
    n_source: Mapped[int] = mapped_column(Integer)  # passages of the reference months
    measures: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # {"unseen_words": .., "cosine": .., "kl": ..}
    computed_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
