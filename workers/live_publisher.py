"""The live shard: queued articles -> small append-only pieces of their month, published as a new
snapshot within seconds, without encoding anything already indexed.

    live_queue (store/intake.py)  --publish_live-->  shards/live-2023-04-000017.<build>.faiss (+ .bm25)
                                                      snapshots/<id>.json   (base shards + the new pieces)

- Each publish encodes only the queued articles' passages and adds one piece per month they fall in
  (key `live-YYYY-MM-NNNNNN`). Pieces share days with their month's shard and each other, never ids.
- A month's pieces are merged into one when there are `merge_pieces` of them (vectors copied, not
  encoded again), so a search fans out over a handful of pieces at most.
- A changed article (a new version) has its old passages taken out of the piece or month shard that
  held them in the same snapshot that adds the new ones.
- The month ingest (`workers.ingest`) compacts: it builds the month shard reusing the pieces' vectors
  and passage rows (same ids, same scores) and drops the pieces.

Crash safety is the ingest's: files are written before the transaction that records the snapshot,
the queue rows go in that same transaction, so a kill at any point leaves the previous snapshot
serving and every acknowledged article either searchable or still queued; a rerun redoes the batch.
One publisher runs at a time per index (`live_lock`); every snapshot writer holds `commit_lock`
from reading its base manifest to its commit, so two writers never lose each other's shards.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from indexer.chunking import chunk_texts, dated_text
from indexer.dates import day_number
from indexer.ids import make_ids
from indexer.lexical import Bm25Shard
from indexer.manifest import Manifest, ShardEntry
from indexer.shards import MonthShard, is_live_key, live_key, live_key_parts
from indexer.snapshot import ShardCache, write_shard
from models.encoders import TextEncoder
from store.queries import add_snapshot
from store.tables import Article, LiveQueueItem, Passage
from workers.compaction import commit_lock
from workers.config import IngestConfig, LiveConfig
from workers.ingest import collect_garbage
from workers.ingest_plans import base_manifest
from workers.locks import JobLock

log = logging.getLogger(__name__)

COMMIT_WAIT_S = 600.0  # how long a publish waits for another writer's commit (a month ingest's is seconds)


def live_lock(index_dir: Path) -> JobLock:
    """One live publisher at a time per index directory."""
    return JobLock(index_dir / "live.lock", "another live publish is running on this index")


@dataclass(frozen=True)
class QueueStatus:
    waiting: int
    oldest: dt.datetime | None  # when the longest-waiting article was queued

    def due(self, cfg: LiveConfig, now: dt.datetime | None = None) -> bool:
        if not self.waiting:
            return False
        if self.waiting >= cfg.batch_articles:
            return True
        now = now or dt.datetime.now(dt.UTC)
        return self.oldest is not None and (now - self.oldest).total_seconds() >= cfg.max_wait_s


def queue_status(session: Session) -> QueueStatus:
    waiting, oldest = session.execute(select(func.count(LiveQueueItem.id), func.min(LiveQueueItem.queued_at))).one()
    if oldest is not None and oldest.tzinfo is None:  # func.min bypasses the column type on SQLite
        oldest = dt.datetime.fromisoformat(str(oldest)).replace(tzinfo=dt.UTC)
    return QueueStatus(int(waiting or 0), oldest)


@dataclass(frozen=True)
class _Queued:
    item_id: int
    version: int
    article_id: int
    text: str
    published: dt.date


def _read_queue(session: Session, limit: int) -> list[_Queued]:
    rows = session.execute(
        select(LiveQueueItem.id, LiveQueueItem.version, Article.id, Article.version, Article.text, Article.published)
        .join(Article, Article.id == LiveQueueItem.article_id)
        .order_by(LiveQueueItem.id)
        .limit(limit)
    ).all()
    # The queue row and the article change in one transaction: their versions agree.
    return [_Queued(r[0], r[1], r[2], r[4], r[5]) for r in rows if r[1] == r[3]]


class _Pieces:
    """Shards changed by one publish: their (ids, vectors) gathered before anything is written."""

    def __init__(self, cache: ShardCache, index_dir: Path):
        self._cache, self._index_dir = cache, index_dir

    def arrays(self, entry: ShardEntry) -> tuple[np.ndarray, np.ndarray]:
        return self._cache.get(self._index_dir, entry).vectors()


def _texts_by_id(session: Session, ids: np.ndarray) -> dict[int, str]:
    """faiss id -> the passage's dated text (what BM25 reads: indexer.chunking.dated_text)."""
    out: dict[int, str] = {}
    id_list = [int(i) for i in ids]
    for start in range(0, len(id_list), 500):
        part = id_list[start : start + 500]
        query = select(Passage.faiss_id, Passage.text, Passage.published).where(Passage.faiss_id.in_(part))
        out.update((fid, dated_text(text, published)) for fid, text, published in session.execute(query))
    return out


def _write(
    session: Session, cfg: IngestConfig, encoder: TextEncoder, key: str, ids: np.ndarray, vectors: np.ndarray
) -> ShardEntry:
    """Write shard `key` over (ids, vectors) with its BM25 index and point its passage rows at it."""
    order = np.argsort(ids, kind="stable")  # id order: the same file whatever order pieces were merged in
    ids, vectors = np.ascontiguousarray(ids[order]), np.ascontiguousarray(vectors[order])
    texts = _texts_by_id(session, ids)
    shard = MonthShard.build(key, vectors, ids, spec=cfg.shard_policy.spec_for(len(ids), encoder.dim))
    entry = write_shard(
        cfg.index_dir, shard, Bm25Shard.build(key, [texts[int(i)] for i in ids], ids), encoder=encoder.name
    )
    id_list = [int(i) for i in ids]
    for start in range(0, len(id_list), 500):
        session.execute(
            update(Passage)
            .where(Passage.faiss_id.in_(id_list[start : start + 500]))
            .values(build_id=entry.build, shard_key=key)
        )
    return entry


def _next_seq(manifest: Manifest, month: str) -> int:
    seqs = [live_key_parts(e.key)[1] for e in manifest.live if live_key_parts(e.key)[0] == month]
    return max(seqs, default=0) + 1


def publish_live(
    sf: sessionmaker[Session],
    encoder: TextEncoder,
    cfg: IngestConfig,
    live: LiveConfig = LiveConfig(),
    *,
    cache: ShardCache | None = None,
) -> dict:
    """Index what waits in the live queue (up to `live.max_batch` articles) as one new snapshot.

    Returns counts and timings ({"articles": 0} when nothing waited).
    """
    cache = cache or ShardCache()
    with live_lock(cfg.index_dir).hold(wait_s=COMMIT_WAIT_S):
        t0 = time.perf_counter()
        with sf() as session:
            queued = _read_queue(session, live.max_batch)
            base_manifest(session, cfg.index_dir, encoder)  # fail fast on an encoder mismatch
        if not queued:
            return {"articles": 0}
        chunks = chunk_texts([q.text for q in queued])
        rows = [(q, i, text) for q, passages in zip(queued, chunks) for i, text in enumerate(passages)]
        vectors = (
            encoder.encode_passages([dated_text(r[2], r[0].published) for r in rows]).astype(np.float32, copy=False)
            if rows
            else np.zeros((0, encoder.dim), np.float32)
        )  # (n, dim)
        t1 = time.perf_counter()
        with commit_lock(cfg.index_dir).hold(wait_s=COMMIT_WAIT_S), sf() as session, session.begin():
            result = _commit(session, cfg, encoder, live, cache, queued, rows, vectors)
        t2 = time.perf_counter()
    collect_garbage(sf, cfg)
    result.update(encode_s=round(t1 - t0, 3), commit_s=round(t2 - t1, 3))
    log.info("live publish: %(articles)d articles, %(passages)d passages -> snapshot %(snapshot)s", result)
    return result


def _commit(
    session: Session,
    cfg: IngestConfig,
    encoder: TextEncoder,
    live: LiveConfig,
    cache: ShardCache,
    queued: list[_Queued],
    rows: list,
    vectors: np.ndarray,
) -> dict:
    base = base_manifest(session, cfg.index_dir, encoder)
    # Only what is still queued as read: a month ingest may have indexed some meanwhile, or a newer
    # version arrived (it stays queued for the next publish).
    still = set(
        session.execute(
            select(LiveQueueItem.id, LiveQueueItem.version).where(LiveQueueItem.id.in_([q.item_id for q in queued]))
        ).all()
    )
    keep_q = {q.article_id for q in queued if (q.item_id, q.version) in still}
    pieces = _Pieces(cache, cfg.index_dir)
    by_build = {e.build: e for e in base.shards}

    # 1. Retire the older versions of these articles from every shard of the base that holds them.
    old = session.execute(
        select(Passage.faiss_id, Passage.build_id).where(
            Passage.article_id.in_(sorted(keep_q)), Passage.build_id.in_(list(by_build))
        )
    ).all()
    retire: dict[str, set[int]] = defaultdict(set)
    for fid, build in old:
        retire[by_build[build].key].add(int(fid))
    changed: dict[str, tuple[np.ndarray, np.ndarray] | None] = {}  # key -> new (ids, vectors); None: dropped
    for key, gone in retire.items():
        ids, vecs = pieces.arrays(base.shard(key))
        mask = ~np.isin(ids, np.fromiter(gone, np.int64))
        changed[key] = (ids[mask], vecs[mask]) if mask.any() else None

    # 2. The new passages: rows first (their primary key is in the id), then one piece per month.
    new_rows = [(r, v) for r, v in zip(rows, vectors) if r[0].article_id in keep_q]
    by_month: dict[str, list] = defaultdict(list)
    if new_rows:
        pks = session.scalars(
            insert(Passage).returning(Passage.id, sort_by_parameter_order=True),
            [
                dict(
                    article_id=q.article_id,
                    ordinal=o,
                    text=t,
                    published=q.published,
                    faiss_id=-(i + 1),
                    shard_key="live",
                    build_id="live-pending",
                )
                for i, ((q, o, t), _) in enumerate(new_rows)
            ],
        ).all()
        ids = make_ids(np.array([day_number(r[0][0].published) for r in new_rows], np.int64), np.asarray(pks, np.int64))
        session.execute(update(Passage), [{"id": pk, "faiss_id": int(fid)} for pk, fid in zip(pks, ids)])
        for (r, v), fid in zip(new_rows, ids):
            by_month[r[0].published.strftime("%Y-%m")].append((int(fid), v))

    add: list[ShardEntry] = []
    drop: set[str] = set()
    for key, arrays in changed.items():
        if not is_live_key(key):  # a month shard keeps its key, minus the old versions
            drop.add(key)
            if arrays is not None:
                add.append(_write(session, cfg, encoder, key, *arrays))
    months = set(by_month) | {live_key_parts(k)[0] for k in changed if is_live_key(k)}
    for month in sorted(months):
        seq = _next_seq(base, month)
        month_pieces = [e for e in base.live if live_key_parts(e.key)[0] == month]
        parts: list[tuple[np.ndarray, np.ndarray]] = []
        if month in by_month:
            parts.append(
                (
                    np.array([i for i, _ in by_month[month]], np.int64),
                    np.stack([v for _, v in by_month[month]]).astype(np.float32),
                )
            )
        merge = bool(parts) and len(month_pieces) + 1 >= live.merge_pieces
        for e in month_pieces:
            if merge or e.key in changed:
                drop.add(e.key)
                arrays = changed[e.key] if e.key in changed else pieces.arrays(e)
                if arrays is None:
                    continue
                if merge:
                    parts.append(arrays)
                else:  # a pruned piece is written again under a new key (files are never rewritten)
                    add.append(_write(session, cfg, encoder, live_key(month, seq), *arrays))
                    seq += 1
        if parts:  # the new passages, with every piece of the month when merging
            add.append(
                _write(
                    session,
                    cfg,
                    encoder,
                    live_key(month, seq),
                    np.concatenate([p[0] for p in parts]),
                    np.concatenate([p[1] for p in parts]),
                )
            )

    manifest = base.with_shards(add, drop=drop)
    add_snapshot(session, cfg.index_dir, manifest)
    done = [(q.item_id, q.version) for q in queued if q.article_id in keep_q]
    if done:
        session.execute(
            delete(LiveQueueItem).where(
                or_(*(and_(LiveQueueItem.id == i, LiveQueueItem.version == v) for i, v in done))
            )
        )
    # An article whose text chunks to nothing has no passage: it leaves the queue all the same.
    return {
        "articles": len(done),
        "passages": len(new_rows),
        "retired": sum(len(v) for v in retire.values()),
        "snapshot": manifest.snapshot_id,
        "pieces": len(manifest.live),
        "vectors_total": manifest.total,
    }


class LivePublisher:
    """The loop the worker process runs: publish whenever the queue is due (`QueueStatus.due`).

    Errors are logged and retried at the next poll (the queue keeps the articles); `stop()` ends it
    after the publish in progress.
    """

    def __init__(
        self,
        sf: sessionmaker[Session],
        load_encoder: Callable[[], TextEncoder],
        cfg: IngestConfig,
        live: LiveConfig = LiveConfig(),
    ):
        self._sf, self._load_encoder, self._cfg, self._live = sf, load_encoder, cfg, live
        self._stop = threading.Event()
        self._cache = ShardCache()
        self.last: dict | None = None  # the last publish's result
        self.last_error: str | None = None

    def step(self) -> dict | None:
        """Publish once if the queue is due; the result, or None when it was not (or another process
        is publishing: it takes the queue)."""
        if live_lock(self._cfg.index_dir).held():
            return None
        with self._sf() as session:
            status = queue_status(session)
        if not status.due(self._live):
            return None
        result = publish_live(self._sf, self._load_encoder(), self._cfg, self._live, cache=self._cache)
        self.last, self.last_error = result, None
        return result

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                while self.step() and not self._stop.is_set():
                    pass  # more may wait than one batch holds
            except Exception as exc:  # the queue keeps the articles: try again at the next poll
                self.last_error = f"{type(exc).__name__}: {exc}"
                log.exception("live publish failed; retrying in %.1f s", self._live.poll_s)
            self._stop.wait(self._live.poll_s)

    def stop(self) -> None:
        self._stop.set()
