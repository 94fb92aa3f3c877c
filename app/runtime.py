"""Wiring: build the database, encoder, reader, index state and services from the settings.

Entry points (app/main.py's lifespan, the CLI) call these; nothing below app/ reads settings.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.config import ReaderSpec, Settings
from app.db.engine import make_engine, make_session_factory
from app.db.migrate import upgrade
from app.services.answering import AnswerLimits, AnswerService
from app.services.index_state import IndexState
from app.services.reader_registry import check_servable, get_version
from app.services.reader_state import ReaderState, RegistrySource
from app.services.retrieval import make_retriever
from indexer.ivf import ShardPolicy
from models.encoders import TextEncoder, load_encoder, resolve_encoder
from models.readers import Reader, load_reader
from evaluation.drift import parse_features
from workers.drift import DriftConfig
from workers.evaluate import EvalConfig
from workers.transport import TransportConfig
from workers.ingest import IngestConfig

log = logging.getLogger(__name__)


@dataclass
class Database:
    engine: Engine
    sessions: sessionmaker[Session]

    def close(self) -> None:
        self.engine.dispose()


def open_database(settings: Settings, *, migrate: bool = True) -> Database:
    settings.ensure_dirs()
    if migrate:
        upgrade(settings.db_url)
    engine = make_engine(settings.db_url)
    return Database(engine, make_session_factory(engine))


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
            return resolve_encoder(name, encoders_dir=settings.encoders_dir, device=settings.device)
        return load_encoder("minilm", device=settings.device)
    return load_encoder(settings.encoder, device=settings.device, encoders_dir=settings.encoders_dir)


AUTO_ENCODER = "auto"


def index_encoder_name(settings: Settings) -> str | None:
    """The encoder the newest serving snapshot was built with, None while there is none."""
    from sqlalchemy import inspect

    from app.services.index_state import latest_snapshot_row

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
            self._cache[name] = resolve_encoder(name, encoders_dir=self._settings.encoders_dir,
                                                device=self._settings.device)
        return self._cache[name]


def index_state(settings: Settings, db: "Database", encoder: TextEncoder, *, lexical: bool = False) -> IndexState:
    """The IndexState for `encoder`: pinned to it, or (SQA_ENCODER=auto) each snapshot with its own encoder."""
    resolver = EncoderResolver(settings, encoder) if settings.encoder == AUTO_ENCODER else None
    return IndexState(db.sessions, settings.index_dir, encoder=encoder.name, dim=encoder.dim, lexical=lexical,
                      resolver=resolver)


FALLBACK_READER = "smollm2"  # what SQA_READER=auto serves while no trained version is active


def load_trained_folder(settings: Settings, folder: Path, *, expect: str | None = None) -> Reader:
    """The trained reader in a version folder; `expect` ("fid"/"extractive") must match its reader.json."""
    from models.trained import load_trained_reader, read_reader_info  # imported here: heavy, only when used

    if expect is not None:
        kind = read_reader_info(folder).get("kind")
        if kind != expect:
            raise ValueError(f"SQA_READER={expect}:{folder} but {folder / 'reader.json'} says kind {kind!r}")
    return load_trained_reader(folder, device=settings.device, max_passages=settings.reader_passages or None)


def build_reader_state(settings: Settings, db: Database | None) -> ReaderState:
    """The serving reader SQA_READER names; with "auto" a state that follows the active version.

    `db` may be None only for specs that need no registry (built-in names and folders).
    """
    configure_torch(settings)
    spec: ReaderSpec = settings.reader_spec
    if spec.kind == "builtin":
        return ReaderState(load_reader(spec.value, device=settings.device, max_passages=settings.reader_passages or 3))
    if spec.kind == "path":
        return ReaderState(load_trained_folder(settings, Path(spec.value), expect=spec.expect))
    if db is None:
        raise ValueError(f"SQA_READER={settings.reader} reads the reader registry: it needs the database")
    if spec.kind == "version":
        with db.sessions() as session:
            row = get_version(session, spec.value)  # NotFoundError
            folder = check_servable(row, settings.models_dir)  # ConflictError: not ready, folder missing
        return ReaderState(load_trained_folder(settings, folder), version=spec.value)
    state = ReaderState(source=RegistrySource(
        db.sessions, settings.models_dir,
        load_version=lambda folder: load_trained_folder(settings, folder),
        load_fallback=lambda: load_reader(FALLBACK_READER, device=settings.device,
                                          max_passages=settings.reader_passages or 3)))
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
    return DriftConfig(profiles_dir=settings.drift_dir / "profiles",
                       features=parse_features(settings.drift_features), on_ingest=settings.drift_on_ingest,
                       batch_size=settings.encode_batch_size)


def transport_config(settings: Settings) -> TransportConfig:
    """Where drift profiles are and the drift measure the F1 regression uses (SQA_DRIFT_MEASURE)."""
    return TransportConfig(index_dir=settings.index_dir, profiles_dir=settings.drift_dir / "profiles",
                           features=parse_features(settings.drift_features), measure=settings.drift_measure)


def eval_config(settings: Settings, max_questions: int | None = None) -> EvalConfig:
    """The evaluation settings: reader passages, questions per quarter (SQA_EVAL_MAX_QUESTIONS unless
    given) and the drift section of the reports."""
    return EvalConfig(reader_passages=settings.reader_passages,
                      max_questions=settings.eval_max_questions if max_questions is None else max_questions,
                      transport=transport_config(settings))


def ingest_config(settings: Settings) -> IngestConfig:
    return IngestConfig(index_dir=settings.index_dir, work_dir=settings.work_dir,
                        batch_size=settings.encode_batch_size,
                        checkpoint_every=settings.checkpoint_every, drift=drift_config(settings),
                        shard_policy=shard_policy(settings))


def shard_policy(settings: Settings) -> ShardPolicy:
    """SQA_IVF_MIN_VECTORS, SQA_IVF_COMPRESSED_MIN_VECTORS and SQA_IVF_CODEC."""
    return ShardPolicy(ivf_min=settings.ivf_min_vectors, compressed_min=settings.ivf_compressed_min_vectors,
                       codec=settings.ivf_codec)


def build_answer_service(settings: Settings, db: Database, encoder: TextEncoder,
                         reader: Reader | ReaderState | None = None) -> AnswerService:
    """`reader`: a fixed Reader, a ReaderState, or None for the state SQA_READER names."""
    if reader is None:
        reader = build_reader_state(settings, db)
    state = index_state(settings, db, encoder, lexical=settings.retriever != "dense")  # SQA_RETRIEVER
    limits = AnswerLimits(default_top_k=settings.top_k, max_top_k=settings.max_top_k,
                          reader_passages=settings.reader_passages, max_question_chars=settings.max_question_chars)
    retriever = make_retriever(settings.retriever, encoder, fusion=settings.fusion,
                               dense_weight=settings.fusion_dense_weight)
    return AnswerService(encoder=encoder, reader=reader, index_state=state, session_factory=db.sessions,
                         limits=limits, retriever=retriever)
