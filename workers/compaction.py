"""Compaction: a month (or history) shard built over its live pieces takes their vectors and passage
rows as they are (same ids, same scores), so closing a month encodes only what never went live.

`workers.ingest.ingest_shard` calls these twice: before encoding, to leave out the articles the live
pieces already hold (`live_articles`), and in its commit, under `commit_lock`, to gather the pieces
as they are then (`gather_live`): a publish that landed meanwhile is folded in, not lost.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from indexer.chunking import dated_text
from indexer.manifest import Manifest, ShardEntry
from indexer.snapshot import ShardCache
from store.tables import Passage
from workers.locks import JobLock


def commit_lock(index_dir: Path) -> JobLock:
    """Held by every snapshot writer (ingest, live publish) from reading its base manifest to its
    commit, so that two writers never build on the same base and lose each other's shards."""
    return JobLock(index_dir / "commit.lock", "another snapshot is being committed on this index")


def live_entries(manifest: Manifest, first: dt.date, last: dt.date) -> list[ShardEntry]:
    """The live pieces of `manifest` whose days lie in [first, last] (pieces never straddle a month)."""
    return [e for e in manifest.live if first <= e.span[0] and e.span[1] <= last]


def live_articles(session: Session, entries: list[ShardEntry]) -> set[int]:
    """Ids of the articles with passages in `entries`."""
    builds = [e.build for e in entries]
    if not builds:
        return set()
    return set(session.scalars(select(Passage.article_id).where(Passage.build_id.in_(builds)).distinct()))


@dataclass(frozen=True)
class LivePart:
    ids: np.ndarray  # (n,) int64
    vectors: np.ndarray  # (n, dim) float32
    texts: list[str]  # the dated texts of ids (what BM25 reads: indexer.chunking.dated_text), in order
    articles: set[int]  # the articles they belong to


def gather_live(
    session: Session, index_dir: Path, entries: list[ShardEntry], dim: int, cache: ShardCache | None = None
) -> LivePart:
    """Every passage of the pieces `entries`: ids, vectors (copied from the shard files), dated texts and articles."""
    cache = cache or ShardCache()
    ids_parts, vec_parts = [np.zeros(0, np.int64)], [np.zeros((0, dim), np.float32)]
    for entry in entries:
        ids, vecs = cache.get(index_dir, entry).vectors()
        ids_parts.append(ids)
        vec_parts.append(vecs.astype(np.float32, copy=False))
    ids, vectors = np.concatenate(ids_parts), np.concatenate(vec_parts)
    rows: dict[int, tuple[int, str]] = {}
    id_list = [int(i) for i in ids]
    for start in range(0, len(id_list), 500):
        for fid, art, text, published in session.execute(
            select(Passage.faiss_id, Passage.article_id, Passage.text, Passage.published).where(
                Passage.faiss_id.in_(id_list[start : start + 500])
            )
        ):
            rows[int(fid)] = (int(art), dated_text(text, published))
    return LivePart(ids, vectors, [rows[i][1] for i in id_list], {a for a, _ in rows.values()})
