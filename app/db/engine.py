"""Engine and session factory. SQLite gets WAL and foreign keys; PostgreSQL is used as is."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        db_path = url.split("///", 1)[-1]
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record):  # pragma: no cover - trivial
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=FULL")
            cur.close()

        return engine
    return create_engine(url, pool_pre_ping=True)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@dataclass
class Database:
    """An engine and its session factory; the entry point that opened it closes it."""

    engine: Engine
    sessions: sessionmaker[Session]

    def close(self) -> None:
        self.engine.dispose()


def open_database(url: str, *, migrate: bool = True) -> Database:
    """Connect (and first bring the schema to the newest migration, unless `migrate` is false)."""
    if migrate:
        from app.db.migrate import upgrade  # alembic: only when migrating

        upgrade(url)
    engine = make_engine(url)
    return Database(engine, make_session_factory(engine))
