"""Where snapshot manifests and shard files live: one small interface, a local folder behind it.

Every file the index writes is named by a relative, "/"-separated name under the index root
("shards/2023-04.1a2b3c4d.faiss", "shards/2023-04.1a2b3c4d.bm25", "snapshots/<id>.json"), written
whole and never changed afterwards (a new build gets a new name). That is all the index code
asks of its storage, so an object store fits the same five methods:

- `read(name)`: the whole file (faiss and BM25 shards are loaded from bytes, never mmapped);
- `write(name, data)`: all or nothing, readers never see half a file;
- `exists(name)`, `list(prefix)` (names with their age, for garbage collection), `delete(name)`.

`LocalStore` is a folder on a local or shared volume (NFS, EFS, a compose volume): writes go to a
temp file beside the target, fsync, rename (`indexer.atomic`). Functions of the index take either
a store or a plain folder path (`as_store`).

Example:
    >>> store = LocalStore(Path("/srv/sqa/index"))
    >>> store.write("snapshots/abc.json", b"{}")
    >>> store.read("snapshots/abc.json")
    b'{}'
    >>> [f.name for f in store.list("snapshots/")]
    ['snapshots/abc.json']
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from indexer.atomic import write_atomic

if TYPE_CHECKING:
    from typing_extensions import Buffer


@dataclass(frozen=True)
class StoredFile:
    """A file in a store: its name and its age in seconds (since it was written)."""

    name: str
    age_s: float


@runtime_checkable
class IndexStore(Protocol):
    """Storage for the index's immutable files, addressed by relative "/"-separated names."""

    def read(self, name: str) -> bytes:
        """The whole file. Raises FileNotFoundError when there is none, OSError when unreadable."""

    def write(self, name: str, data: Buffer) -> None:
        """Store `data` (bytes or a buffer) under `name`, atomically: readers see all of it or none."""

    def exists(self, name: str) -> bool:
        """Whether a file is stored under `name`."""

    def list(self, prefix: str) -> list[StoredFile]:
        """Every file whose name starts with `prefix` (e.g. "shards/"), temp files included."""

    def delete(self, name: str) -> None:
        """Remove `name`; no error when it is already gone."""

    def locate(self, name: str) -> str:
        """Where `name` is, for messages and as a cache key (a path, a URL)."""


def check_name(name: str) -> str:
    """A store name must be relative and stay under the root: no "..", no absolute path."""
    pure = PurePosixPath(name)
    if not name or pure.is_absolute() or ".." in pure.parts or "\\" in name:
        raise ValueError(f"store names are relative paths under the index root, not {name!r}")
    return str(pure)


class LocalStore:
    """An index root on a local (or shared, mounted) file system."""

    def __init__(self, root: str | os.PathLike[str]):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, LocalStore) and self.root.resolve() == other.root.resolve()

    def __hash__(self) -> int:
        return hash(self.root.resolve())

    def path(self, name: str) -> Path:
        """The local path of `name`."""
        return self.root / check_name(name)

    def read(self, name: str) -> bytes:
        return self.path(name).read_bytes()

    def write(self, name: str, data: Buffer) -> None:
        path = self.path(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, data)

    def exists(self, name: str) -> bool:
        return self.path(name).is_file()

    def list(self, prefix: str) -> list[StoredFile]:
        folder, _, start = prefix.rpartition("/")
        directory = self.root / check_name(folder) if folder else self.root
        if not directory.is_dir():
            return []
        now = time.time()
        found = []
        for entry in os.scandir(directory):
            if entry.is_file() and entry.name.startswith(start):
                name = f"{folder}/{entry.name}" if folder else entry.name
                found.append(StoredFile(name, now - entry.stat().st_mtime))
        return sorted(found, key=lambda f: f.name)

    def delete(self, name: str) -> None:
        self.path(name).unlink(missing_ok=True)

    def locate(self, name: str) -> str:
        return str(self.path(name).resolve())


def as_store(where: IndexStore | str | os.PathLike[str]) -> IndexStore:
    """`where` itself when it is a store, else a LocalStore on that folder."""
    return where if isinstance(where, IndexStore) else LocalStore(where)
