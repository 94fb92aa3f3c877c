"""Switch the index to another encoder version: re-encode every shard, then swap in one snapshot.

`sqa index reencode --encoder VERSION` and `POST /admin/index/reencode` run this job. The serving
snapshot keeps answering with its own encoder while the new vectors are computed; the new snapshot
(every shard re-encoded, each recording the new encoder) is committed in one transaction, and a
server with SQA_ENCODER=auto swaps it in together with its query encoder, so no query ever meets
two encoders. Passage rows are not copied: a re-encoded shard has the same ids and points at the
rows of the shard it replaces (`ShardEntry.rows`), and its BM25 file is the old one (BM25 does not
depend on the encoder). Embeddings are checkpointed per shard under the work directory, so a
crashed or interrupted job resumes when run again; the ingest lock keeps ingests out meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import time
from dataclasses import replace

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from indexer.chunking import dated_text
from indexer.manifest import Manifest, read_manifest
from indexer.shards import MonthShard
from indexer.snapshot import write_shard
from models.encoders import TextEncoder
from serving.errors import InvalidInputError
from serving.index_state import latest_snapshot_row
from store.queries import add_snapshot
from store.tables import Job, Passage
from workers.config import IngestConfig
from workers.ingest import collect_garbage, encode_with_checkpoints, ingest_lock
from workers.runner import JobHandle, JobRunner

log = logging.getLogger(__name__)

STAGE_WEIGHTS = {"encode": 0.97, "commit": 0.03}


def serving_manifest(session: Session, cfg: IngestConfig) -> Manifest:
    row = latest_snapshot_row(session)
    if row is None:
        raise InvalidInputError("nothing to re-encode: no index snapshot exists yet (run `sqa ingest` first)")
    return read_manifest(cfg.index_dir, row.manifest_file, expected_sha256=row.manifest_sha256)


def shard_rows(session: Session, entry) -> tuple[np.ndarray, list[str]]:
    """(faiss ids (n,) int64, the passages' dated texts: what the encoder reads) of a shard, in id order."""
    rows = session.execute(
        select(Passage.faiss_id, Passage.text, Passage.published)
        .where(Passage.build_id == entry.build)
        .order_by(Passage.faiss_id)
    ).all()
    if len(rows) != entry.count:
        raise InvalidInputError(
            f"shard {entry.key} has {entry.count} vectors but {len(rows)} passage rows; "
            "rebuild it with `sqa index rebuild`"
        )
    return np.array([r.faiss_id for r in rows], dtype=np.int64), [dated_text(r.text, r.published) for r in rows]


def reencode_work(sf: sessionmaker[Session], encoder: TextEncoder, cfg: IngestConfig):
    """The work of a re-encode job (for `JobRunner.run`, under `ingest_lock`)."""
    return lambda job: _reencode(sf, encoder, cfg, job)


def _reencode(sf, encoder: TextEncoder, cfg: IngestConfig, job: JobHandle) -> None:
    t0 = time.perf_counter()
    progress = job
    with sf() as session, session.begin():
        old = serving_manifest(session, cfg)
        if old.encoder == encoder.name:
            job.succeed_in(
                session,
                f"the index is already encoded with {encoder.name}",
                counts={"snapshot": None, "encoder": encoder.name},
            )
            return
        sources = [(e, *shard_rows(session, e)) for e in old.shards]
    # encode_with_checkpoints opens an "encode" stage per shard: each shard is one round of the
    # weighted stages, so the fraction reaches 1 with the last shard, not the first
    job.progress.rounds(len(sources))
    entries, works = [], []
    for entry, ids, texts in sources:
        digest = hashlib.sha256(f"{encoder.name}\x00{entry.key}\x00{entry.build}".encode()).hexdigest()[:16]
        work = cfg.work_dir / f"reencode-{entry.key}-{digest}"
        works.append(work)
        vectors = encode_with_checkpoints(encoder, texts, work, cfg, progress)  # (n, dim)
        shard = MonthShard.build(entry.key, vectors, ids, spec=cfg.shard_policy.spec_for(len(ids), encoder.dim))
        new = write_shard(cfg.index_dir, shard, encoder=encoder.name)
        entries.append(replace(new, bm25=entry.bm25, rows=entry.build))
    t1 = time.perf_counter()
    progress.stage("commit", 1)
    with sf() as session, session.begin():
        if serving_manifest(session, cfg).snapshot_id != old.snapshot_id:  # cannot happen under the lock
            raise InvalidInputError("the index changed while it was being re-encoded; run the job again")
        manifest = Manifest.new(encoder.name, encoder.dim, entries)
        add_snapshot(session, cfg.index_dir, manifest, job_id=job.job_id)
        job.succeed_in(
            session,
            counts={
                "snapshot": manifest.snapshot_id,
                "previous_snapshot": old.snapshot_id,
                "encoder": encoder.name,
                "previous_encoder": old.encoder,
                "shards": len(entries),
                "passages": manifest.total,
            },
            timings={"encode_s": round(t1 - t0, 1), "passages_per_s": round(manifest.total / max(t1 - t0, 1e-9), 1)},
        )
    for work in works:
        shutil.rmtree(work, ignore_errors=True)
    collect_garbage(sf, cfg)


def reencode(
    sf: sessionmaker[Session],
    encoder: TextEncoder,
    cfg: IngestConfig,
    *,
    runner: JobRunner | None = None,
    bar: bool = False,
) -> Job:
    """Validate, record a job, run it here and now (the CLI's and the tests' way in)."""
    with sf() as session:
        serving_manifest(session, cfg)  # bad input fails before a job row exists
    runner = runner or JobRunner(sf, cfg.work_dir / "jobs", bar=bar)
    job_id = runner.create("reencode", {"encoder": encoder.name})
    runner.run(job_id, reencode_work(sf, encoder, cfg), lock=ingest_lock(cfg.index_dir), weights=STAGE_WEIGHTS)
    return runner.get(job_id)
