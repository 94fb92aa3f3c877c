"""Which index snapshot serves, and the atomic swap to a newer one.

The database names the snapshot (the newest `index_snapshots` row); the manifest file names the
shard files and their checksums. Both must agree, or the index is refused with a rebuild command.
Readers take `current()` once per request and keep it: a swap never disturbs a request in flight.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from indexer.lexical import LexicalIndex
from indexer.manifest import Manifest, read_manifest
from indexer.shards import ShardedIndex
from indexer.snapshot import IndexIntegrityError, LexicalMissingError, ShardCache
from indexer.storage import IndexStore, as_store
from models.encoders import TextEncoder
from store.tables import IndexSnapshot

log = logging.getLogger(__name__)

REBUILD_HINT = "rebuild it with `sqa index rebuild` (re-encodes every ingested month from the database)"


@dataclass(frozen=True)
class LoadedSnapshot:
    row_id: int
    snapshot_id: str
    manifest: Manifest
    index: ShardedIndex
    loaded_at: dt.datetime
    lexical: LexicalIndex | None = None  # the BM25 shards, when opened with lexical=True and all exist
    lexical_error: str | None = None  # why `lexical` is None although it was asked for
    encoder: TextEncoder | None = None  # the query encoder of this snapshot's encoder version (SQA_ENCODER=auto)
    load_s: float = 0.0  # seconds to open and verify it (shards already loaded for the previous one are reused)

    @property
    def newest_day(self) -> dt.date | None:
        return self.index.max_day


def latest_snapshot_row(session: Session) -> IndexSnapshot | None:
    """The snapshot that serves: the newest of kind "serving"."""
    return session.scalars(
        select(IndexSnapshot).where(IndexSnapshot.kind == "serving").order_by(IndexSnapshot.id.desc()).limit(1)
    ).first()


def open_snapshot_row(
    row: IndexSnapshot,
    index_dir: Path | IndexStore,
    cache: ShardCache,
    *,
    encoder: str,
    dim: int,
    lexical: bool = False,
    resolver: Callable[[str], TextEncoder] | None = None,
) -> LoadedSnapshot:
    """Check the manifest file against the database row, then open and verify its shards.

    `lexical` opens the BM25 shards too; a snapshot built before BM25 existed still opens (dense
    search works) with `lexical_error` saying how to build them. With `resolver` (name -> encoder)
    any encoder version is accepted and the snapshot carries its own query encoder; without it the
    snapshot must have been built with `encoder`.
    """
    t0 = time.perf_counter()
    store = as_store(index_dir)
    if not store.exists(row.manifest_file):
        raise IndexIntegrityError(
            f"snapshot {row.snapshot_id}: manifest {store.locate(row.manifest_file)} recorded "
            f"in the database is missing; {REBUILD_HINT}"
        )
    manifest = read_manifest(store, row.manifest_file, expected_sha256=row.manifest_sha256)
    if manifest.snapshot_id != row.snapshot_id or manifest.total != row.total:
        raise IndexIntegrityError(
            f"snapshot {row.snapshot_id}: manifest says {manifest.snapshot_id} with {manifest.total} vectors, "
            f"the database says {row.snapshot_id} with {row.total}; {REBUILD_HINT}"
        )
    query_encoder = None
    if resolver is not None:
        try:
            query_encoder = resolver(manifest.encoder)
        except (ValueError, RuntimeError, OSError) as exc:
            raise IndexIntegrityError(f"snapshot {row.snapshot_id}: {exc}") from None
        encoder, dim = query_encoder.name, query_encoder.dim
    index = cache.open_snapshot(index_dir, manifest, expected_encoder=encoder, expected_dim=dim)
    lexical_index, lexical_error = None, None
    if lexical:
        try:
            lexical_index = cache.open_lexical(index_dir, manifest)
        except LexicalMissingError as exc:
            lexical_error = str(exc)
            log.warning("%s", exc)
    return LoadedSnapshot(
        row.id,
        row.snapshot_id,
        manifest,
        index,
        dt.datetime.now(dt.UTC),
        lexical_index,
        lexical_error,
        query_encoder,
        load_s=time.perf_counter() - t0,
    )


class IndexState:
    """Holds the serving snapshot; `refresh` swaps in a newer one atomically."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        index_dir: Path,
        *,
        encoder: str,
        dim: int,
        lexical: bool = False,
        resolver: Callable[[str], TextEncoder] | None = None,
    ) -> None:
        """`lexical`: open each snapshot's BM25 shards too (SQA_RETRIEVER bm25 or hybrid).
        `resolver`: follow the encoder each snapshot records (SQA_ENCODER=auto), so that a
        re-encoded snapshot swaps in together with its query encoder."""
        self._resolver = resolver
        self._session_factory = session_factory
        self._lexical = lexical
        self._index_dir = index_dir
        self._encoder = encoder
        self._dim = dim
        self._cache = ShardCache()
        self._current: LoadedSnapshot | None = None
        self._lock = threading.Lock()  # serialises refreshes, never held by readers

    def current(self) -> LoadedSnapshot | None:
        return self._current

    def open(self, row: IndexSnapshot) -> LoadedSnapshot:
        """Load any recorded snapshot (a replay's quarter-end state) without serving it."""
        return open_snapshot_row(
            row,
            self._index_dir,
            self._cache,
            encoder=self._encoder,
            dim=self._dim,
            lexical=self._lexical,
            resolver=self._resolver,
        )

    def refresh(self) -> bool:
        """Load the newest snapshot if it is not the one serving. Returns True if it swapped.

        Raises IndexIntegrityError when the newest snapshot does not match its files.
        """
        with self._lock:
            with self._session_factory() as session:
                row = latest_snapshot_row(session)
            if row is None or (self._current is not None and self._current.row_id == row.id):
                return False
            loaded = self.open(row)
            self._current = loaded  # a single reference assignment: the swap is atomic
            self._cache.retain(self._index_dir, [loaded.manifest])  # drop shards only older snapshots used
            log.info(
                "serving index snapshot %s (%d vectors, %d shards, loaded in %.2f s)",
                loaded.snapshot_id,
                loaded.index.ntotal,
                len(loaded.manifest.shards),
                loaded.load_s,
            )
            return True
