"""Snapshots: immutable shard files plus a manifest that names them (`indexer.manifest`).

Writing a shard file and its BM25 index, loading and verifying the shards a manifest names
(`ShardCache`), and listing the files no kept manifest references (`garbage_files`).
`ShardCache.open_snapshot` checks everything against the manifest before anything is served.

Example:
    >>> entry = write_shard(index_dir, MonthShard.build("2023-04", vectors, ids))
    >>> manifest = Manifest.new(encoder="all-MiniLM-L6-v2", dim=384).with_shard(entry)
    >>> path, sha = write_manifest(index_dir, manifest)
    >>> index = ShardCache().open_snapshot(index_dir, read_manifest(path), expected_encoder="all-MiniLM-L6-v2", expected_dim=384)
"""
from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from indexer.atomic import TMP_SUFFIX as _TMP_SUFFIX, write_atomic
from indexer.errors import REBUILD_HINT, IndexIntegrityError
from indexer.lexical import Bm25Shard, LexicalIndex
from indexer.manifest import SHARDS_DIR, SNAPSHOTS_DIR, FileRef, Manifest, ShardEntry, sha256_hex
from indexer.shards import MonthShard, ShardedIndex

__all__ = ["IndexIntegrityError", "LexicalMissingError", "ShardCache", "write_shard", "write_lexical",
           "garbage_files"]


class LexicalMissingError(IndexIntegrityError):
    """A snapshot has shards without a BM25 index (built before BM25 existed)."""


def write_shard(index_dir: Path, shard: MonthShard, lexical: Bm25Shard | None = None, *,
                encoder: str | None = None) -> ShardEntry:
    """Write `shard` (and its BM25 index) to new files under index_dir/shards/; returns its manifest
    entry, which records `encoder` (the encoder version of its vectors)."""
    directory = Path(index_dir) / SHARDS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    while (path := directory / f"{shard.key}.{secrets.token_hex(4)}.faiss").exists():
        pass  # never overwrite an existing (immutable) shard file
    data = shard.to_bytes()  # (nbytes,) uint8
    write_atomic(path, data)
    entry = ShardEntry(
        key=shard.key,
        file=f"{SHARDS_DIR}/{path.name}",
        sha256=sha256_hex(data),
        count=shard.ntotal,
        min_day=shard.min_day.isoformat(),
        max_day=shard.max_day.isoformat(),
        dim=shard.dim,
        index=shard.spec,
        encoder=encoder,
    )
    return entry if lexical is None else write_lexical(index_dir, entry, lexical)


def write_lexical(index_dir: Path, entry: ShardEntry, lexical: Bm25Shard) -> ShardEntry:
    """Write `lexical` beside the shard file `entry` names (same build id, ".bm25"); returns the entry
    with it. The BM25 index must hold exactly the shard's passages (checked here by count)."""
    if lexical.key != entry.key or lexical.ntotal != entry.count:
        raise ValueError(f"BM25 index {lexical.key} ({lexical.ntotal} passages) does not match shard "
                         f"{entry.key} ({entry.count} vectors)")
    path = (Path(index_dir) / entry.file).with_suffix(".bm25")
    data = lexical.to_bytes()
    write_atomic(path, data)  # a rebuild of the same shard's BM25 replaces it whole
    return replace(entry, bm25=FileRef(f"{SHARDS_DIR}/{path.name}", sha256_hex(data)))


class ShardCache:
    """Loaded shards by file, shared between snapshots (a file is never rewritten, so a path is
    its content). The sha256 is checked on first load. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loaded: dict[Path, tuple[ShardEntry, MonthShard]] = {}
        self._lexical: dict[Path, tuple[FileRef, Bm25Shard]] = {}

    def __len__(self) -> int:
        return len(self._loaded)

    def get(self, index_dir: Path, entry: ShardEntry) -> MonthShard:
        """The shard `entry` names, loaded and verified once."""
        path = (Path(index_dir) / entry.file).resolve()
        where = f"shard {entry.key} ({entry.file} in {index_dir})"
        if not path.is_file():
            raise IndexIntegrityError(f"{where} is missing; {REBUILD_HINT}")
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
                data = path.read_bytes()
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
                data, entry.key, entry.count, entry.dim, min_day=min_day, max_day=max_day, source=str(path),
                spec=entry.index,
            )
            self._loaded[path] = (entry.faiss_part, shard)
            return shard

    def get_lexical(self, index_dir: Path, entry: ShardEntry) -> Bm25Shard:
        """The BM25 index of shard `entry`, loaded and verified (sha256, count, days) once."""
        if entry.bm25 is None:
            raise LexicalMissingError(f"shard {entry.key} has no BM25 index")
        path = (Path(index_dir) / entry.bm25.file).resolve()
        where = f"BM25 index of shard {entry.key} ({entry.bm25.file} in {index_dir})"
        with self._lock:
            cached = self._lexical.get(path)
            if cached is not None and cached[0] == entry.bm25:
                return cached[1]
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise IndexIntegrityError(f"{where} cannot be read ({exc.strerror}); {REBUILD_HINT}") from None
            if sha256_hex(data) != entry.bm25.sha256:
                raise IndexIntegrityError(f"{where} has sha256 {sha256_hex(data)}, the manifest says "
                                          f"{entry.bm25.sha256}; {REBUILD_HINT}")
            shard = Bm25Shard.from_bytes(data, entry.key, entry.count, source=str(path))
            if (shard.min_day, shard.max_day) != entry.span:
                raise IndexIntegrityError(f"{where} spans {shard.min_day}..{shard.max_day}, the shard "
                                          f"{entry.min_day}..{entry.max_day}; {REBUILD_HINT}")
            self._lexical[path] = (entry.bm25, shard)
            return shard

    def open_lexical(self, index_dir: Path, manifest: Manifest) -> LexicalIndex:
        """The BM25 indexes of every shard of `manifest`.

        Raises:
            LexicalMissingError: some shards have none (name them; `sqa index bm25` builds them).
            IndexIntegrityError: a BM25 file is missing, changed or disagrees with its shard.
        """
        missing = [e.key for e in manifest.shards if e.bm25 is None]
        if missing:
            raise LexicalMissingError(
                f"index snapshot {manifest.snapshot_id} has no BM25 index for shard(s) {', '.join(missing)} "
                "(built before BM25 existed): build them with `sqa index bm25`, or set SQA_RETRIEVER=dense")
        return LexicalIndex(self.get_lexical(index_dir, e) for e in manifest.shards)

    def open_snapshot(
        self,
        index_dir: Path,
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
        shards = [self.get(index_dir, entry) for entry in manifest.shards]
        return ShardedIndex(shards, dim=manifest.dim)

    def retain(self, index_dir: Path, keep: Iterable[Manifest]) -> int:
        """Forget shards no kept manifest uses (after a snapshot swap); returns how many."""
        paths = {(Path(index_dir) / e.file).resolve() for m in keep for e in m.shards}
        paths |= {(Path(index_dir) / e.bm25.file).resolve() for m in keep for e in m.shards if e.bm25}
        with self._lock:
            gone = [p for p in self._loaded if p not in paths]
            for p in gone:
                del self._loaded[p]
            for p in [p for p in self._lexical if p not in paths]:
                del self._lexical[p]
        return len(gone)


def garbage_files(index_dir: Path, keep: Iterable[Manifest], *, min_age_s: float = 3600.0) -> list[Path]:
    """Shard, BM25 and manifest files (and stray temp files) that no kept manifest references.

    Files younger than `min_age_s` are left alone: they may belong to an ingest still writing
    its snapshot. Only names this module writes are considered. Deleting is the caller's job.
    """
    keep = list(keep)
    if not keep:
        raise ValueError("garbage_files needs at least one manifest to keep (else everything is garbage)")
    index_dir = Path(index_dir)
    referenced = {(index_dir / e.file).resolve() for m in keep for e in m.shards}
    referenced |= {(index_dir / e.bm25.file).resolve() for m in keep for e in m.shards if e.bm25}
    referenced |= {(index_dir / SNAPSHOTS_DIR / m.file_name).resolve() for m in keep}
    patterns = {SHARDS_DIR: ("*.faiss", "*.bm25", f".*{_TMP_SUFFIX}"), SNAPSHOTS_DIR: ("*.json", f".*{_TMP_SUFFIX}")}
    now = time.time()
    found = []
    for sub, globs in patterns.items():
        directory = index_dir / sub
        if not directory.is_dir():
            continue
        for pattern in globs:
            for path in directory.glob(pattern):
                if not path.is_file() or path.resolve() in referenced:
                    continue
                if now - path.stat().st_mtime >= min_age_s:
                    found.append(path)
    return sorted(set(found))
