"""Snapshots: immutable shard files plus a manifest that names them (`indexer.manifest`).

Writing a shard file and its BM25 index, loading and verifying the shards a manifest names
(`ShardCache`), and listing the files no kept manifest references (`garbage_files`).
`ShardCache.open_snapshot` checks everything against the manifest before anything is served.

Example:
    >>> entry = write_shard(index_dir, MonthShard.build("2023-04", vectors, ids))
    >>> manifest = Manifest.new(encoder="all-MiniLM-L6-v2", dim=384).with_shard(entry)
    >>> path, sha = write_manifest(index_dir, manifest)
    >>> index = ShardCache().open_snapshot(index_dir, read_manifest(path),
    ...                                    expected_encoder="all-MiniLM-L6-v2", expected_dim=384)
"""

from __future__ import annotations

import os
import secrets
import threading
from collections.abc import Iterable
from dataclasses import replace
from pathlib import PurePosixPath
from typing import TYPE_CHECKING

from indexer.atomic import TMP_SUFFIX as _TMP_SUFFIX
from indexer.index_errors import REBUILD_HINT, IndexIntegrityError
from indexer.lexical import Bm25Shard, LexicalIndex
from indexer.manifest import SHARDS_DIR, SNAPSHOTS_DIR, FileRef, Manifest, ShardEntry, sha256_hex
from indexer.shards import MonthShard, ShardedIndex
from indexer.storage import IndexStore, as_store

if TYPE_CHECKING:
    from typing_extensions import Buffer

Where = IndexStore | str | os.PathLike[str]  # an index root: a store, or a folder (a LocalStore on it)

__all__ = ["IndexIntegrityError", "LexicalMissingError", "ShardCache", "write_shard", "write_lexical", "garbage_files"]


class LexicalMissingError(IndexIntegrityError):
    """A snapshot has shards without a BM25 index (built before BM25 existed)."""


def write_shard(
    index_dir: Where, shard: MonthShard, lexical: Bm25Shard | None = None, *, encoder: str | None = None
) -> ShardEntry:
    """Write `shard` (and its BM25 index) to new files under shards/ of the index root `index_dir`
    (a store or a folder); returns its manifest entry, which records `encoder` (the encoder
    version of its vectors)."""
    store = as_store(index_dir)
    while store.exists(name := f"{SHARDS_DIR}/{shard.key}.{secrets.token_hex(4)}.faiss"):
        pass  # never overwrite an existing (immutable) shard file
    # numpy declares ndarray.__buffer__ for Python >= 3.12 only (PEP 688); it is a buffer on 3.11 as well
    data: Buffer = shard.to_bytes()  # type: ignore[assignment]  # (nbytes,) uint8
    store.write(name, data)
    entry = ShardEntry(
        key=shard.key,
        file=name,
        sha256=sha256_hex(data),
        count=shard.ntotal,
        min_day=shard.min_day.isoformat(),
        max_day=shard.max_day.isoformat(),
        dim=shard.dim,
        index=shard.spec,
        encoder=encoder,
    )
    return entry if lexical is None else write_lexical(store, entry, lexical)


def write_lexical(index_dir: Where, entry: ShardEntry, lexical: Bm25Shard) -> ShardEntry:
    """Write `lexical` beside the shard file `entry` names (same build id, ".bm25"); returns the entry
    with it. The BM25 index must hold exactly the shard's passages (checked here by count)."""
    if lexical.key != entry.key or lexical.ntotal != entry.count:
        raise ValueError(
            f"BM25 index {lexical.key} ({lexical.ntotal} passages) does not match shard "
            f"{entry.key} ({entry.count} vectors)"
        )
    name = str(PurePosixPath(entry.file).with_suffix(".bm25"))
    data = lexical.to_bytes()
    as_store(index_dir).write(name, data)  # a rebuild of the same shard's BM25 replaces it whole
    return replace(entry, bm25=FileRef(name, sha256_hex(data)))


class ShardCache:
    """Loaded shards by file, shared between snapshots (a file is never rewritten, so a location is
    its content). The sha256 is checked on first load. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loaded: dict[str, tuple[ShardEntry, MonthShard]] = {}
        self._lexical: dict[str, tuple[FileRef, Bm25Shard]] = {}

    def __len__(self) -> int:
        return len(self._loaded)

    def get(self, index_dir: Where, entry: ShardEntry) -> MonthShard:
        """The shard `entry` names, loaded and verified once."""
        store = as_store(index_dir)
        path = store.locate(entry.file)
        where = f"shard {entry.key} ({path})"
        with self._lock:
            cached = self._loaded.get(path)
            if cached is not None:
                if cached[0] != entry.faiss_part:
                    raise IndexIntegrityError(
                        f"{where} was loaded as {cached[0]} and is now described as {entry}; "
                        f"shard files must never be rewritten; {REBUILD_HINT}"
                    )
                return cached[1]
            try:
                data = store.read(entry.file)
            except FileNotFoundError:
                raise IndexIntegrityError(f"{where} is missing; {REBUILD_HINT}") from None
            except OSError as exc:
                raise IndexIntegrityError(f"{where} cannot be read ({exc.strerror}); {REBUILD_HINT}") from None
            sha = sha256_hex(data)
            if sha != entry.sha256:
                raise IndexIntegrityError(
                    f"{where} has sha256 {sha}, the manifest says {entry.sha256}: the file changed or is "
                    f"corrupt; {REBUILD_HINT}"
                )
            min_day, max_day = entry.span
            shard = MonthShard.from_bytes(
                data,
                entry.key,
                entry.count,
                entry.dim,
                min_day=min_day,
                max_day=max_day,
                source=path,
                spec=entry.index,
            )
            self._loaded[path] = (entry.faiss_part, shard)
            return shard

    def get_lexical(self, index_dir: Where, entry: ShardEntry) -> Bm25Shard:
        """The BM25 index of shard `entry`, loaded and verified (sha256, count, days) once."""
        if entry.bm25 is None:
            raise LexicalMissingError(f"shard {entry.key} has no BM25 index")
        store = as_store(index_dir)
        path = store.locate(entry.bm25.file)
        where = f"BM25 index of shard {entry.key} ({path})"
        with self._lock:
            cached = self._lexical.get(path)
            if cached is not None and cached[0] == entry.bm25:
                return cached[1]
            try:
                data = store.read(entry.bm25.file)
            except OSError as exc:
                raise IndexIntegrityError(f"{where} cannot be read ({exc.strerror}); {REBUILD_HINT}") from None
            if sha256_hex(data) != entry.bm25.sha256:
                raise IndexIntegrityError(
                    f"{where} has sha256 {sha256_hex(data)}, the manifest says {entry.bm25.sha256}; {REBUILD_HINT}"
                )
            shard = Bm25Shard.from_bytes(data, entry.key, entry.count, source=path)
            if (shard.min_day, shard.max_day) != entry.span:
                raise IndexIntegrityError(
                    f"{where} spans {shard.min_day}..{shard.max_day}, the shard "
                    f"{entry.min_day}..{entry.max_day}; {REBUILD_HINT}"
                )
            self._lexical[path] = (entry.bm25, shard)
            return shard

    def open_lexical(self, index_dir: Where, manifest: Manifest) -> LexicalIndex:
        """The BM25 indexes of every shard of `manifest`.

        Raises:
            LexicalMissingError: some shards have none (name them; `sqa index bm25` builds them).
            IndexIntegrityError: a BM25 file is missing, changed or disagrees with its shard.
        """
        missing = [e.key for e in manifest.shards if e.bm25 is None]
        if missing:
            raise LexicalMissingError(
                f"index snapshot {manifest.snapshot_id} has no BM25 index for shard(s) {', '.join(missing)} "
                "(built before BM25 existed): build them with `sqa index bm25`, or set SQA_RETRIEVER=dense"
            )
        store = as_store(index_dir)
        return LexicalIndex(self.get_lexical(store, e) for e in manifest.shards)

    def open_snapshot(
        self,
        index_dir: Where,
        manifest: Manifest,
        *,
        expected_encoder: str | None,
        expected_dim: int | None,
    ) -> ShardedIndex:
        """Load and verify every shard of `manifest`. Raises IndexIntegrityError on any disagreement."""
        where = f"index snapshot {manifest.snapshot_id}"
        if expected_encoder is not None and manifest.encoder != expected_encoder:
            raise IndexIntegrityError(
                f"{where} was built with encoder {manifest.encoder!r}, the service encodes queries with "
                f"{expected_encoder!r}; {REBUILD_HINT}"
            )
        if expected_dim is not None and manifest.dim != expected_dim:
            raise IndexIntegrityError(
                f"{where} has dimension {manifest.dim}, the encoder produces {expected_dim}; {REBUILD_HINT}"
            )
        store = as_store(index_dir)
        shards = [self.get(store, entry) for entry in manifest.shards]
        return ShardedIndex(shards, dim=manifest.dim)

    def retain(self, index_dir: Where, keep: Iterable[Manifest]) -> int:
        """Forget shards no kept manifest uses (after a snapshot swap); returns how many."""
        store = as_store(index_dir)
        paths = {store.locate(e.file) for m in keep for e in m.shards}
        paths |= {store.locate(e.bm25.file) for m in keep for e in m.shards if e.bm25}
        with self._lock:
            gone = [p for p in self._loaded if p not in paths]
            for p in gone:
                del self._loaded[p]
            for p in [p for p in self._lexical if p not in paths]:
                del self._lexical[p]
        return len(gone)


def garbage_files(index_dir: Where, keep: Iterable[Manifest], *, min_age_s: float = 3600.0) -> list[str]:
    """Names of the shard, BM25 and manifest files (and stray temp files) that no kept manifest
    references, in the store (or folder) `index_dir`.

    Files younger than `min_age_s` are left alone: they may belong to an ingest still writing
    its snapshot. Only names this module writes are considered. Deleting is the caller's job
    (`store.delete(name)`).
    """
    keep = list(keep)
    if not keep:
        raise ValueError("garbage_files needs at least one manifest to keep (else everything is garbage)")
    store = as_store(index_dir)
    referenced = {e.file for m in keep for e in m.shards}
    referenced |= {e.bm25.file for m in keep for e in m.shards if e.bm25}
    referenced |= {f"{SNAPSHOTS_DIR}/{m.file_name}" for m in keep}
    patterns = {SHARDS_DIR: (".faiss", ".bm25"), SNAPSHOTS_DIR: (".json",)}
    found = []
    for sub, suffixes in patterns.items():
        for f in store.list(f"{sub}/"):
            base = f.name.rpartition("/")[2]
            ours = (
                base.endswith(suffixes)
                and not base.startswith(".")
                or (base.startswith(".") and base.endswith(_TMP_SUFFIX))
            )
            if ours and f.name not in referenced and f.age_s >= min_age_s:
                found.append(f.name)
    return sorted(set(found))
