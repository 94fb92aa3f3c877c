"""Index manifests: the immutable record of one snapshot (its shard files, their sha256, counts,
index type and encoder), and reading and writing it crash-safely.

    index_dir/
      shards/<key>.<8 hex>.faiss        one MonthShard each, never rewritten
      shards/<key>.<8 hex>.bm25         its BM25 index (same build id), when the shard has one
      snapshots/<snapshot_id>.json      a Manifest: the shard files, their sha256, counts, index
                                        type (flat or IVF, `indexer.ivf.ShardSpec`), encoder

A new month or a rebuilt month writes new shard files (`indexer.snapshot.write_shard`) and a new
manifest (temp file, fsync, rename, fsync the directory), so a crash leaves either the old snapshot
or the new one, never a half-written file under a real name. The manifest's sha256 is what the
database records.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import re
import secrets
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any, cast

from indexer.index_errors import REBUILD_HINT, IndexIntegrityError
from indexer.ivf import FLAT, ShardSpec
from indexer.shards import check_key, is_live_key
from indexer.storage import IndexStore, LocalStore, as_store

if TYPE_CHECKING:
    from typing_extensions import Buffer

__all__ = [
    "FileRef",
    "ShardEntry",
    "Manifest",
    "new_snapshot_id",
    "write_manifest",
    "read_manifest",
    "sha256_hex",
    "SHARDS_DIR",
    "SNAPSHOTS_DIR",
]

MANIFEST_FORMAT = 1
SHARDS_DIR = "shards"
SNAPSHOTS_DIR = "snapshots"
_SNAPSHOT_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_SHA_RE = re.compile(r"^[0-9a-f]{64}$")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_rel_path(key: str, file: object) -> None:
    p = PurePosixPath(file) if isinstance(file, str) else None
    if p is None or p.is_absolute() or ".." in p.parts or not p.parts or "\\" in str(file):  # file is a str here
        raise ValueError(f"shard {key}: file {file!r} must be a relative path inside the index directory")


@dataclass(frozen=True)
class FileRef:
    """A file that belongs to a shard (its BM25 index), relative to the index directory."""

    file: str
    sha256: str


@dataclass(frozen=True)
class ShardEntry:
    """One shard file of a snapshot, as the manifest records it.

    `index` is the FAISS index type (omitted from the JSON for flat shards, so older manifests
    read unchanged); `bm25` the shard's BM25 file, None in snapshots built before it existed;
    `encoder` the encoder version that made its vectors (None in shards written before it was
    recorded: the manifest's encoder); `rows` the build id of the passage rows its ids point to,
    when they are another shard file's (a re-encoded shard keeps the rows of the shard it replaced).
    """

    key: str
    file: str  # relative to the index directory, '/'-separated: "shards/2023-04.1a2b3c4d.faiss"
    sha256: str
    count: int
    min_day: str  # ISO date of the earliest passage
    max_day: str  # ISO date of the latest passage
    dim: int
    index: ShardSpec = FLAT
    bm25: FileRef | None = None
    encoder: str | None = None
    rows: str | None = None

    def __post_init__(self) -> None:
        check_key(self.key)
        for name in ("encoder", "rows"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not _SNAPSHOT_ID_RE.match(value)):
                raise ValueError(f"shard {self.key}: {name} {value!r} must be letters, digits, '.', '-' or '_'")
        _check_rel_path(self.key, self.file)
        for sha in (self.sha256, self.bm25.sha256 if self.bm25 else None):
            if sha is not None and (not isinstance(sha, str) or not _SHA_RE.match(sha)):
                raise ValueError(f"shard {self.key}: sha256 {sha!r} is not 64 lowercase hex digits")
        if not isinstance(self.index, ShardSpec):
            raise ValueError(f"shard {self.key}: index {self.index!r} must be a ShardSpec")
        if self.bm25 is not None:
            if not isinstance(self.bm25, FileRef):
                raise ValueError(f"shard {self.key}: bm25 {self.bm25!r} must be a FileRef")
            _check_rel_path(self.key, self.bm25.file)
        if not _is_int(self.count) or self.count < 1:
            raise ValueError(f"shard {self.key}: count {self.count!r} must be a positive integer")
        if not _is_int(self.dim) or self.dim < 1:
            raise ValueError(f"shard {self.key}: dim {self.dim!r} must be a positive integer")
        lo, hi = self.span  # raises on a bad date
        if lo > hi:
            raise ValueError(f"shard {self.key}: min_day {self.min_day} is after max_day {self.max_day}")

    @property
    def span(self) -> tuple[dt.date, dt.date]:
        """(min_day, max_day) as dates."""
        try:
            return dt.date.fromisoformat(self.min_day), dt.date.fromisoformat(self.max_day)
        except (TypeError, ValueError):
            raise ValueError(f"shard {self.key}: days {self.min_day!r}..{self.max_day!r} are not YYYY-MM-DD") from None

    @property
    def build(self) -> str:
        """The build id of the passage rows this shard's ids point to (`Passage.build_id`)."""
        return self.rows or PurePosixPath(self.file).name

    @property
    def faiss_part(self) -> ShardEntry:
        """The entry without its BM25 file: what identifies the FAISS shard file."""
        return replace(self, bm25=None)

    def to_dict(self) -> dict[str, Any]:
        body = asdict(self)
        if self.index == FLAT:
            del body["index"]
        for name in ("bm25", "encoder", "rows"):
            if body[name] is None:
                del body[name]
        return body

    @classmethod
    def from_dict(cls, body: dict[str, Any]) -> ShardEntry:
        body = dict(body)
        index = body.pop("index", None)
        bm25 = body.pop("bm25", None)
        return cls(
            **body, index=FLAT if index is None else ShardSpec(**index), bm25=None if bm25 is None else FileRef(**bm25)
        )


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def new_snapshot_id(now: dt.datetime | None = None) -> str:
    """'20230414T120000Z-1a2b3c4d': sorts by creation time, unique by its random tail."""
    return f"{(now or _utc_now()):%Y%m%dT%H%M%SZ}-{secrets.token_hex(4)}"


@dataclass(frozen=True)
class Manifest:
    """One immutable state of the index. Shards are kept sorted by min_day and may not overlap."""

    snapshot_id: str
    created_at: str  # UTC, ISO 8601 with +00:00
    encoder: str  # the passage encoder's name and version; queries must use the same
    dim: int
    shards: tuple[ShardEntry, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.snapshot_id, str) or not _SNAPSHOT_ID_RE.match(self.snapshot_id):
            raise ValueError(f"snapshot_id {self.snapshot_id!r} must be letters, digits, '.', '-' or '_'")
        try:
            created = dt.datetime.fromisoformat(self.created_at)
        except (TypeError, ValueError):
            created = None
        if created is None or created.utcoffset() != dt.timedelta(0) or not self.created_at.endswith("+00:00"):
            raise ValueError(f"created_at {self.created_at!r} must be UTC ISO 8601 ending in +00:00")
        if not isinstance(self.encoder, str) or not self.encoder:
            raise ValueError("encoder must name the passage encoder")
        if not _is_int(self.dim) or self.dim < 1:
            raise ValueError(f"dim {self.dim!r} must be a positive integer")
        shards = tuple(sorted(self.shards, key=lambda e: e.span[0]))
        object.__setattr__(self, "shards", shards)
        keys = [e.key for e in shards]
        if len(set(keys)) != len(keys):
            raise ValueError(f"shard keys repeat: {keys}")
        for e in shards:
            if e.dim != self.dim:
                raise ValueError(f"shard {e.key} has dim {e.dim}, the manifest {self.dim}")
            if e.encoder is not None and e.encoder != self.encoder:  # a query never mixes encoders
                raise ValueError(
                    f"shard {e.key} was encoded with {e.encoder}, the manifest's encoder is {self.encoder}"
                )
        settled = [e for e in shards if not is_live_key(e.key)]  # live pieces may share days (ids never)
        for prev, cur in zip(settled, settled[1:]):
            if cur.span[0] <= prev.span[1]:
                raise ValueError(
                    f"shards {prev.key} ({prev.min_day}..{prev.max_day}) and {cur.key} "
                    f"({cur.min_day}..{cur.max_day}) overlap; drop one with with_shard(entry, drop=...)"
                )

    @classmethod
    def new(cls, encoder: str, dim: int, shards: Iterable[ShardEntry] = ()) -> Manifest:
        """A manifest with a fresh snapshot id, created now."""
        now = _utc_now()
        return cls(new_snapshot_id(now), now.isoformat(), encoder, dim, tuple(shards))

    @property
    def total(self) -> int:
        """Vectors over all shards."""
        return sum(e.count for e in self.shards)

    @property
    def file_name(self) -> str:
        return f"{self.snapshot_id}.json"

    def shard(self, key: str) -> ShardEntry | None:
        return next((e for e in self.shards if e.key == key), None)

    def with_shard(self, entry: ShardEntry, *, drop: Iterable[str] = ()) -> Manifest:
        """A new snapshot (fresh id and created_at) with `entry` added or replacing its key.

        `drop` removes other keys too, e.g. the months a merged history shard now holds.
        """
        gone = set(drop) | {entry.key}
        now = _utc_now()
        return replace(
            self,
            snapshot_id=new_snapshot_id(now),
            created_at=now.isoformat(),
            shards=tuple(e for e in self.shards if e.key not in gone) + (entry,),
        )

    def with_shards(self, add: Iterable[ShardEntry], *, drop: Iterable[str] = ()) -> Manifest:
        """A new snapshot (fresh id and created_at) with the entries `add` (replacing their keys)
        and without the keys `drop`: a live publish adds pieces and retires others at once."""
        add = tuple(add)
        gone = set(drop) | {e.key for e in add}
        now = _utc_now()
        return replace(
            self,
            snapshot_id=new_snapshot_id(now),
            created_at=now.isoformat(),
            shards=tuple(e for e in self.shards if e.key not in gone) + add,
        )

    @property
    def live(self) -> tuple[ShardEntry, ...]:
        """The live pieces (`indexer.shards.is_live_key`)."""
        return tuple(e for e in self.shards if is_live_key(e.key))

    def to_json(self) -> str:
        body = {"format": MANIFEST_FORMAT, **asdict(self), "total": self.total}
        body["shards"] = [e.to_dict() for e in self.shards]
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, *, source: str = "manifest") -> Manifest:
        """Parse `to_json` output. Raises IndexIntegrityError if it is garbled or inconsistent."""
        try:
            body = json.loads(text)
            if not isinstance(body, dict) or body.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"not a format {MANIFEST_FORMAT} index manifest")
            total = body.pop("total", None)
            body.pop("format")
            shards = tuple(ShardEntry.from_dict(e) for e in body.pop("shards"))
            manifest = cls(**body, shards=shards)
            if total is not None and total != manifest.total:
                raise ValueError(f"total {total} is not the sum of shard counts {manifest.total}")
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise IndexIntegrityError(f"{source} is not a valid index manifest ({exc}); {REBUILD_HINT}") from None
        return manifest


def sha256_hex(data: Buffer) -> str:
    """The sha256 of a file's bytes, as manifests record it (64 lowercase hex digits)."""
    return hashlib.sha256(data).hexdigest()


def write_manifest(index_dir: IndexStore | str | os.PathLike[str], manifest: Manifest) -> tuple[str, str]:
    """Write snapshots/<snapshot_id>.json of the index root `index_dir` (a folder or an
    `indexer.storage` store) atomically; returns its name ("snapshots/<id>.json", what a snapshot
    row records as `manifest_file`) and the sha256 of the file.

    Writing the same manifest again is a no-op; a different manifest under an existing
    snapshot id raises FileExistsError (manifests are immutable, make a new one).
    """
    store = as_store(index_dir)
    name = f"{SNAPSHOTS_DIR}/{manifest.file_name}"
    data = manifest.to_json().encode("utf-8")
    if store.exists(name):
        if store.read(name) == data:
            return name, sha256_hex(data)
        raise FileExistsError(
            f"snapshot {manifest.snapshot_id} already exists at {store.locate(name)} with other contents"
        )
    store.write(name, data)
    return name, sha256_hex(data)


def read_manifest(
    where: IndexStore | str | os.PathLike[str], name: str | None = None, *, expected_sha256: str | None = None
) -> Manifest:
    """Read a manifest, optionally checking it is the one the database recorded: `name` (a
    snapshot row's `manifest_file`) in the index root `where` (a folder or a store), or, without
    `name`, the manifest file at the path `where`."""
    store: IndexStore
    if name is None:
        path_of_file = Path(cast("str | os.PathLike[str]", where))  # without `name`, `where` is the file's path
        store, name = LocalStore(path_of_file.parent), path_of_file.name
    else:
        store = as_store(where)
    path = store.locate(name)
    try:
        data = store.read(name)
    except OSError as exc:
        raise IndexIntegrityError(f"index manifest {path} cannot be read ({exc.strerror}); {REBUILD_HINT}") from None
    if expected_sha256 is not None and sha256_hex(data) != expected_sha256:
        raise IndexIntegrityError(
            f"index manifest {path} has checksum sha256 {sha256_hex(data)}, the database recorded {expected_sha256}; "
            f"{REBUILD_HINT}"
        )
    return Manifest.from_json(data, source=f"index manifest {path}")
