"""One process at a time per piece of work: OS file locks, released if the process dies."""
from __future__ import annotations

import contextlib
import fcntl
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from app.services.errors import ConflictError


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

    def hold(self) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.path, self.busy)

    def held(self) -> bool:
        return lock_held(self.path)
