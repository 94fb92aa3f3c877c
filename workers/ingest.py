"""The ingest job: articles of a month (or a history backfill) -> dated passages -> a new shard
and a new snapshot, committed in one database transaction.

Crash safety: embeddings are checkpointed under the work directory as they are computed, so a
re-run resumes where the last one stopped; shard and manifest files are written before the
transaction that records them commits, so a crash leaves the previous snapshot serving and, at
worst, unreferenced files that a later ingest deletes.

What an ingest is asked to do and the shards it plans are workers/ingest_plans.py's.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import secrets
import shutil
import time
from pathlib import Path

import numpy as np
from sqlalchemy import and_, delete, insert, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from indexer.chunking import chunk_texts, dated_text
from indexer.dates import day_number
from indexer.ids import make_ids
from indexer.index_errors import IndexIntegrityError
from indexer.lexical import Bm25Shard
from indexer.manifest import SNAPSHOTS_DIR, read_manifest
from indexer.shards import MonthShard
from indexer.snapshot import garbage_files, write_shard
from indexer.storage import as_store
from models.encoders import TextEncoder
from serving.errors import ConflictError, NoArticlesError
from store.queries import add_snapshot
from store.tables import Article, IndexSnapshot, Job, LiveQueueItem, Passage
from workers.compaction import commit_lock, gather_live, live_articles, live_entries
from workers.config import IngestConfig
from workers.ingest_plans import IngestParams, ShardPlan, base_manifest, overlapping_keys, plans_for
from workers.locks import JobLock
from workers.month_drift import drift_after_ingest
from workers.progress import Progress
from workers.runner import JobHandle, JobRunner

log = logging.getLogger(__name__)

# Share of an ingest's wall time in each stage, for the job's progress fraction.
STAGE_WEIGHTS = {"chunk": 0.05, "encode": 0.9, "commit": 0.05}


# ---- the ingest lock -------------------------------------------------------------------------------


def ingest_lock(index_dir: Path) -> JobLock:
    """One ingest (or re-encode, or BM25 build) at a time per index directory."""
    return JobLock(index_dir / "ingest.lock", "another ingest is running on this index; wait for it to finish")


# ---- one shard -------------------------------------------------------------------------------------


def save_checkpoint(path: Path, arr: np.ndarray) -> None:
    """Write a block of embeddings atomically (a crash leaves the old file or none, never half of one)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    with open(tmp, "wb") as fh:
        np.save(fh, arr)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def checkpoint_blocks(texts: list[str], work: Path, cfg: IngestConfig) -> list[tuple[Path, list[str]]]:
    """(checkpoint file, texts) of each block of `cfg.checkpoint_every` passages of `texts` taken
    longest first (`longest_first`): what encode_with_checkpoints and the Ray backfill encode."""
    ordered = [texts[i] for i in longest_first(texts)]
    return [
        (work / f"emb-sorted-{b:06d}.npy", ordered[start : start + cfg.checkpoint_every])
        for b, start in enumerate(range(0, len(ordered), cfg.checkpoint_every))
    ]


def longest_first(texts: list[str]) -> np.ndarray:
    """The order that encodes `texts` longest first (by characters; ties in their order): every
    checkpoint block then holds passages of about one length, and a batch pads little. The blocks'
    files are named for this order (`emb-sorted-*`), so a block saved in another order is never read."""
    return np.argsort([-len(t) for t in texts], kind="stable")


def load_checkpoint(path: Path, n: int, dim: int) -> np.ndarray | None:
    """A block's saved embeddings, or None when it is missing or not (n, dim)."""
    if not path.exists():
        return None
    arr = np.load(path)
    return arr if arr.shape == (n, dim) else None


def encode_with_checkpoints(
    encoder: TextEncoder, texts: list[str], work: Path, cfg: IngestConfig, progress: Progress
) -> np.ndarray:
    """(n, dim) float32 embeddings of `texts`, in their order; finished blocks are saved so an
    interrupted run resumes. The texts are encoded longest first (`longest_first`): sorted within
    each block only, the blocks' batches padded 10-20% more (measured on a distilled passage tower)."""
    work.mkdir(parents=True, exist_ok=True)
    progress.stage("encode", len(texts))
    order = longest_first(texts)
    blocks = []
    for path, part in checkpoint_blocks(texts, work, cfg):
        arr = load_checkpoint(path, len(part), encoder.dim)
        if arr is not None:
            blocks.append(arr)
            progress.advance(len(part))
            continue
        # One call per block: sentence-transformers sorts by length within a call, which pads less.
        arr = encoder.encode_passages(part, batch_size=cfg.batch_size).astype(np.float32, copy=False)
        progress.advance(len(part))
        save_checkpoint(path, arr)
        blocks.append(arr)
    if not blocks:
        return np.zeros((0, encoder.dim), dtype=np.float32)
    out = np.empty((len(texts), encoder.dim), dtype=np.float32)
    out[order] = np.concatenate(blocks)
    return out


def shard_rows(
    sf: sessionmaker[Session], plan: ShardPlan, progress: Progress | None = None
) -> tuple[list, list[tuple[int, int, str, dt.date]]]:
    """The plan's articles and their passages as (article id, ordinal, body, published) rows, in the
    order the shard indexes them; NoArticlesError when it has none."""
    with sf() as session:
        arts = session.execute(
            select(Article.id, Article.text, Article.published, Article.version)
            .where(Article.published.between(plan.first, plan.last))
            .order_by(Article.published, Article.id)
        ).all()
    if not arts:
        raise NoArticlesError(f"no articles published in {plan.key}: import them first (`sqa import ...`)")
    if progress is not None:
        progress.stage("chunk", len(arts))
    chunks = chunk_texts([a.text for a in arts])
    if progress is not None:
        progress.advance(len(arts))
    return arts, [(a.id, i, text, a.published) for a, passages in zip(arts, chunks) for i, text in enumerate(passages)]


def model_texts(rows) -> list[str]:
    """What the encoder and BM25 read of (article id, ordinal, body, published) rows: each
    passage's dated text (indexer.chunking.dated_text), in order."""
    return [dated_text(text, published) for _, _, text, published in rows]


def checkpoint_dir(cfg: IngestConfig, encoder: TextEncoder, plan: ShardPlan, rows) -> Path:
    """Where the plan's embedding checkpoints go: named by the encoder and the exact passages, so a
    checkpoint is only ever reused for the same passages (as the encoder reads them) encoded by the
    same encoder."""
    digest = hashlib.sha256(encoder.name.encode())
    for (art_id, ordinal, _, _), text in zip(rows, model_texts(rows)):
        digest.update(f"\x00{art_id}\x00{ordinal}\x00{text}".encode())
    return cfg.work_dir / f"ingest-{plan.key}-{digest.hexdigest()[:16]}"


def ingest_shard(
    sf: sessionmaker[Session],
    encoder: TextEncoder,
    plan: ShardPlan,
    cfg: IngestConfig,
    progress: Progress,
    *,
    job: JobHandle | None = None,
    finish_job: bool = False,
    fresh: bool = False,
) -> dict:
    """Build the plan's shard from the articles in the database and commit a new snapshot.

    With `job`, the shard's counts and timings go on its row; `finish_job` marks it succeeded in
    the same transaction that records the snapshot. Returns counts and timings.
    """
    job_id = job.job_id if job is not None else None
    t0 = time.perf_counter()
    with sf() as session:
        base_manifest(session, cfg.index_dir, encoder, fresh=fresh)  # fail fast on an encoder mismatch
    arts, rows = shard_rows(sf, plan, progress)
    with sf() as session:  # what the live pieces hold already is copied at the commit, not encoded
        pre = base_manifest(session, cfg.index_dir, encoder, fresh=fresh)
        live_now = set() if fresh else live_articles(session, live_entries(pre, plan.first, plan.last))
    rows = [r for r in rows if r[0] not in live_now]
    texts = model_texts(rows)
    t1 = time.perf_counter()

    work = checkpoint_dir(cfg, encoder, plan, rows)
    vectors = encode_with_checkpoints(encoder, texts, work, cfg, progress)  # (n, dim)
    t2 = time.perf_counter()

    progress.stage("commit", 1)
    with commit_lock(cfg.index_dir).hold(wait_s=600), sf() as session, session.begin():
        base = base_manifest(session, cfg.index_dir, encoder, fresh=fresh)
        # The live pieces as they are now (a publish may have landed since): their passages go in as they are.
        live = gather_live(
            session, cfg.index_dir, [] if fresh else live_entries(base, plan.first, plan.last), encoder.dim
        )
        own = [i for i, r in enumerate(rows) if r[0] not in live.articles]
        rows, vectors = [rows[i] for i in own], vectors[own] if own else vectors[:0]
        tmp_build = f"tmp-{secrets.token_hex(8)}"
        pks = (
            session.scalars(
                insert(Passage).returning(Passage.id, sort_by_parameter_order=True),
                [
                    dict(
                        article_id=a,
                        ordinal=o,
                        text=t,
                        published=p,
                        faiss_id=-(i + 1),
                        shard_key=plan.key,
                        build_id=tmp_build,
                    )
                    for i, (a, o, t, p) in enumerate(rows)
                ],
            ).all()
            if rows
            else []
        )
        days = np.array([day_number(r[3]) for r in rows], dtype=np.int64)
        ids = make_ids(days, np.asarray(pks, dtype=np.int64))  # (n,) day << 40 | primary key
        if rows:
            session.execute(update(Passage), [{"id": pk, "faiss_id": int(fid)} for pk, fid in zip(pks, ids)])
        ids = np.concatenate([ids, live.ids])
        vectors = np.ascontiguousarray(np.concatenate([vectors, live.vectors]), dtype=np.float32)
        texts = model_texts(rows) + live.texts
        shard = MonthShard.build(plan.key, vectors, ids, spec=cfg.shard_policy.spec_for(len(ids), encoder.dim))
        entry = write_shard(
            cfg.index_dir,
            shard,
            Bm25Shard.build(plan.key, texts, ids),  # + its BM25 file
            encoder=encoder.name,
        )
        build = entry.build
        session.execute(update(Passage).where(Passage.build_id == tmp_build).values(build_id=build))
        reused = [int(i) for i in live.ids]
        for start in range(0, len(reused), 500):
            session.execute(
                update(Passage)
                .where(Passage.faiss_id.in_(reused[start : start + 500]))
                .values(build_id=build, shard_key=plan.key)
            )
        # The queued articles indexed here, in the version read, leave the live queue in this commit.
        done = [(a.id, a.version) for a in arts if a.id not in live.articles]
        for start in range(0, len(done), 500):
            session.execute(
                delete(LiveQueueItem).where(
                    or_(
                        *(
                            and_(LiveQueueItem.article_id == i, LiveQueueItem.version == v)
                            for i, v in done[start : start + 500]
                        )
                    )
                )
            )
        manifest = base.with_shard(entry, drop=overlapping_keys(base, plan))
        add_snapshot(session, cfg.index_dir, manifest, job_id=job_id)
        t3 = time.perf_counter()
        counts = {
            "articles": len(arts),
            "passages": len(ids),
            "from_live": len(reused),
            "snapshot": manifest.snapshot_id,
            "vectors_total": manifest.total,
        }
        timings = {
            "chunk_s": round(t1 - t0, 3),
            "encode_s": round(t2 - t1, 3),
            "commit_s": round(t3 - t2, 3),
            "passages_per_s": round(len(ids) / max(t3 - t0, 1e-9), 2),
        }
        if job is not None:
            if finish_job:
                job.succeed_in(session, counts={plan.key: counts}, timings={plan.key: timings})
            else:
                job.update_in(session, counts={plan.key: counts}, timings={plan.key: timings})
    shutil.rmtree(work, ignore_errors=True)
    collect_garbage(sf, cfg)
    result = {**counts, **timings}
    if cfg.drift is not None and cfg.drift.on_ingest and not plan.key.startswith("history-"):
        result["drift"] = drift_after_ingest(sf, cfg.index_dir, plan.key, cfg.drift)  # never raises
        _record_drift(sf, job_id, plan.key, result["drift"])
    return result


def _record_drift(sf: sessionmaker[Session], job_id: int | None, key: str, drift: dict) -> None:
    """Note the drift outcome in the job's counts for the shard (the job may already be finished)."""
    if job_id is None:
        return
    try:
        with sf() as session, session.begin():
            job = session.get(Job, job_id)
            counts = dict(job.counts or {})
            counts[key] = {**counts.get(key, {}), "drift": drift}
            job.counts = counts
    except Exception:
        log.exception("could not record the drift of %s on job %s", key, job_id)


def collect_garbage(sf: sessionmaker[Session], cfg: IngestConfig) -> None:
    """Drop passage rows and files that no kept snapshot refers to (the newest serving ones and
    every quarter-end snapshot a replay recorded), then the rows of the serving snapshots whose
    manifest went with them: a live stream publishes a snapshot every few seconds, and a row whose
    files are gone can serve nothing."""
    with sf() as session, session.begin():
        rows = list(
            session.scalars(
                select(IndexSnapshot)
                .where(IndexSnapshot.kind == "serving")
                .order_by(IndexSnapshot.id.desc())
                .limit(cfg.keep_snapshots)
            )
        )
        rows += session.scalars(select(IndexSnapshot).where(IndexSnapshot.kind != "serving")).all()
        manifests = []
        for row in rows:
            try:
                manifests.append(read_manifest(cfg.index_dir, row.manifest_file))
            except IndexIntegrityError:
                log.warning("snapshot %s: manifest unreadable, skipped by garbage collection", row.snapshot_id)
        if not manifests:
            return
        keep = {e.build for m in manifests for e in m.shards}
        session.execute(delete(Passage).where(Passage.build_id.not_in(keep)))
    store = as_store(cfg.index_dir)
    deleted = garbage_files(store, manifests)
    for name in deleted:
        store.delete(name)
    gone = [name for name in deleted if name.startswith(f"{SNAPSHOTS_DIR}/")]
    if not gone:  # the common case on a live publish: no transaction for nothing
        return
    with sf() as session, session.begin():
        for i in range(0, len(gone), 500):  # bounded IN lists
            session.execute(
                delete(IndexSnapshot).where(
                    IndexSnapshot.kind == "serving", IndexSnapshot.manifest_file.in_(gone[i : i + 500])
                )
            )


# ---- the job ---------------------------------------------------------------------------------------


def ingest_work(sf: sessionmaker[Session], encoder: TextEncoder, cfg: IngestConfig, params: IngestParams):
    """The work of an ingest job (for `JobRunner.run`, under `ingest_lock`): every planned shard,
    the last one committed together with the job's success."""

    def work(job: JobHandle) -> None:
        with sf() as session:
            plans, empty, fresh = plans_for(session, params, cfg, encoder)
        job.update(counts={"planned": [p.key for p in plans], "empty_months": empty})
        job.progress.rounds(len(plans))  # chunk, encode and commit once per shard
        for i, plan in enumerate(plans):
            ingest_shard(sf, encoder, plan, cfg, job, job=job, finish_job=i == len(plans) - 1, fresh=fresh and i == 0)
        if not plans:
            with sf() as session, session.begin():
                job.succeed_in(session, "nothing to ingest: every month with articles is already indexed")

    return work


def ingest(
    sf: sessionmaker[Session],
    encoder: TextEncoder,
    cfg: IngestConfig,
    params: IngestParams | dict,
    *,
    runner: JobRunner | None = None,
    bar: bool = False,
) -> Job:
    """Validate, record a job, run it here and now (the CLI's and the tests' way in). A dict is
    parsed first (`IngestParams.parse`); bad input fails before a job row exists."""
    if isinstance(params, dict):
        params = IngestParams.parse(params)
    with sf() as session:
        plans_for(session, params, cfg, encoder)
    lock = ingest_lock(cfg.index_dir)
    if lock.held():  # refused before a job row exists, as the API refuses (the lock still decides below)
        raise ConflictError(lock.busy)
    runner = runner or JobRunner(sf, cfg.work_dir / "jobs", bar=bar)
    job_id = runner.create("ingest", params.to_json())
    runner.run(job_id, ingest_work(sf, encoder, cfg, params), lock=lock, weights=STAGE_WEIGHTS)
    return runner.get(job_id)
