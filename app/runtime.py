"""Wiring: build the database, encoder, reader, index state and services from the settings.

Entry points (app/main.py's lifespan, the CLI) call these; nothing below app/ reads settings.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from app.core.config import Settings
from app.db.engine import make_engine, make_session_factory
from app.db.migrate import upgrade
from app.services.answering import AnswerLimits, AnswerService
from app.services.index_state import IndexState
from models.encoders import TextEncoder, load_encoder
from models.readers import Reader, load_reader
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
    configure_torch(settings)
    return load_encoder(settings.encoder, device=settings.device)


def build_reader(settings: Settings) -> Reader:
    configure_torch(settings)
    return load_reader(settings.reader, device=settings.device, max_passages=settings.reader_passages)


def ingest_config(settings: Settings) -> IngestConfig:
    return IngestConfig(index_dir=settings.index_dir, work_dir=settings.work_dir,
                        batch_size=settings.encode_batch_size,
                        checkpoint_every=settings.checkpoint_every)


def build_answer_service(settings: Settings, db: Database, encoder: TextEncoder, reader: Reader) -> AnswerService:
    state = IndexState(db.sessions, settings.index_dir, encoder=encoder.name, dim=encoder.dim)
    limits = AnswerLimits(default_top_k=settings.top_k, max_top_k=settings.max_top_k,
                          reader_passages=settings.reader_passages, max_question_chars=settings.max_question_chars)
    return AnswerService(encoder=encoder, reader=reader, index_state=state, session_factory=db.sessions,
                         limits=limits)
