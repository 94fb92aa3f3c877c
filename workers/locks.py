"""One process at a time per piece of work, released if the process dies.

Two kinds, one interface (`hold(wait_s)`, `held()`, `busy`):
- `JobLock`: an OS file lock under SQA_HOME: the processes of one machine (and SQLite's one writer);
- `AdvisoryLock`: a PostgreSQL session advisory lock, held on a connection of its own: the
  processes of every machine on one database (several `sqa worker`s). The server drops it when
  the holder's connection ends, a killed process's included.
`JobRunner.lock(name)` picks the advisory lock when the database is PostgreSQL.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import Engine

from serving.errors import ConflictError

POLL_S = 0.5  # how often a waiting holder tries again


@contextlib.contextmanager
def _acquired(make: Callable[[], contextlib.AbstractContextManager[None]], wait_s: float) -> Iterator[None]:
    """Enter `make()`; while it is busy (ConflictError), try again every POLL_S up to `wait_s` seconds."""
    deadline = time.monotonic() + max(0.0, wait_s)
    with contextlib.ExitStack() as stack:
        while True:
            try:
                stack.enter_context(make())
                break
            except ConflictError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(POLL_S)
        yield


@contextlib.contextmanager
def file_lock(path: Path, busy_message: str) -> Iterator[None]:
    """Hold an exclusive lock on `path`; ConflictError(busy_message) if another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConflictError(busy_message) from None
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def lock_held(path: Path) -> bool:
    """True while some process holds the lock on `path`."""
    try:
        with file_lock(path, ""):
            return False
    except ConflictError:
        return True


@dataclass(frozen=True)
class JobLock:
    """A named file lock with the message a second holder gets (ConflictError, HTTP 409)."""

    path: Path
    busy: str

    def hold(self, wait_s: float = 0.0) -> contextlib.AbstractContextManager[None]:
        """Hold it (waiting up to `wait_s` seconds for another holder to let go)."""
        return _acquired(lambda: file_lock(self.path, self.busy), wait_s)

    def held(self) -> bool:
        return lock_held(self.path)


def advisory_key(name: str) -> int:
    """A stable signed 64-bit key for a lock name (PostgreSQL's advisory locks take a bigint)."""
    return int.from_bytes(hashlib.blake2b(f"sqa:{name}".encode(), digest_size=8).digest(), "big", signed=True)


@contextlib.contextmanager
def advisory_lock(engine: Engine, name: str, busy_message: str) -> Iterator[None]:
    """Hold the session advisory lock `name` on a connection of its own; ConflictError if held."""
    key = advisory_key(name)
    conn = engine.connect()
    try:
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
        conn.commit()
        if not got:
            raise ConflictError(busy_message)
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
            conn.commit()
    finally:
        conn.close()


@dataclass(frozen=True)
class AdvisoryLock:
    """A named PostgreSQL advisory lock, for holders on several machines (same interface as JobLock)."""

    engine: Engine
    name: str
    busy: str

    def hold(self, wait_s: float = 0.0) -> contextlib.AbstractContextManager[None]:
        """Hold it (waiting up to `wait_s` seconds for another holder to let go or die)."""
        return _acquired(lambda: advisory_lock(self.engine, self.name, self.busy), wait_s)

    def held(self) -> bool:
        try:
            with advisory_lock(self.engine, self.name, ""):
                return False
        except ConflictError:
            return True
