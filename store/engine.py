"""Engine and session factory. SQLite gets WAL and foreign keys; PostgreSQL is used as is."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        db_path = url.split("///", 1)[-1]
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 60})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:  # pragma: no cover - trivial
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
    """Connect (and first bring the schema to the newest migration, unless `migrate` is false).

    A database already at the newest migration is left alone without loading Alembic (a third of
    a second that every short command would pay)."""
    engine = make_engine(url)
    if migrate and not schema_is_current(engine):
        from store.migrate import upgrade  # noqa: PLC0415 (lazy: alembic, a third of a second, only when migrating)

        upgrade(url)
    return Database(engine, make_session_factory(engine))


_REVISION = re.compile(r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(?:['\"]([^'\"]+)['\"]|None)", re.M)


@functools.cache
def head_revisions() -> frozenset[str]:
    """The newest migration(s): the revisions of migrations/versions that none revises."""
    revisions: set[str] = set()
    downs: set[str] = set()
    for path in (Path(str(files("migrations"))) / "versions").glob("*.py"):
        for kind, value in _REVISION.findall(path.read_text(encoding="utf-8")):
            (revisions if kind == "revision" else downs).add(value)
    return frozenset(revisions - downs)


def schema_is_current(engine: Engine) -> bool:
    """Whether the database records exactly the newest migration(s) in alembic_version."""
    try:
        with engine.connect() as conn:
            stored = {row[0] for row in conn.execute(text("SELECT version_num FROM alembic_version"))}
    except DBAPIError:  # no table yet (a new database), or not reachable: let Alembic say
        return False
    return bool(stored) and stored == head_revisions()
