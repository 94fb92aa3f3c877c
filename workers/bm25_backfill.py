"""Build the BM25 files that snapshots from before BM25 lack (`sqa index bm25`).

Ingest writes a BM25 file beside every new shard. Shards ingested earlier have none, so
SQA_RETRIEVER=bm25 or hybrid cannot serve them; this job builds one per such shard from the
passage rows of its build (no re-encoding), writes each atomically beside its FAISS file, and
commits a new snapshot naming them, under the ingest lock. The FAISS files are unchanged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from indexer.chunking import dated_text
from indexer.index_errors import REBUILD_HINT, IndexIntegrityError
from indexer.lexical import Bm25Shard
from indexer.manifest import Manifest, read_manifest
from indexer.snapshot import write_lexical
from serving.errors import InvalidInputError
from serving.index_state import latest_snapshot_row
from store.queries import add_snapshot
from store.tables import Passage
from workers.ingest import ingest_lock

log = logging.getLogger(__name__)


def build_missing_lexical(sf: sessionmaker[Session], index_dir: Path) -> dict:
    """BM25 files for every shard of the serving snapshot without one, and a snapshot naming them.

    Returns:
        {"snapshot": the serving snapshot id afterwards, "built": [shard keys], "passages": count}.
    Raises:
        InvalidInputError: there is no snapshot yet.
        IndexIntegrityError: a shard's passage rows disagree with its manifest entry.
    """
    with ingest_lock(index_dir).hold():
        with sf() as session:
            row = latest_snapshot_row(session)
            if row is None:
                raise InvalidInputError("no index snapshot yet: run `sqa ingest --through YYYY-MM` first")
            manifest = read_manifest(index_dir, row.manifest_file, expected_sha256=row.manifest_sha256)
        missing = [e for e in manifest.shards if e.bm25 is None]
        if not missing:
            return {"snapshot": manifest.snapshot_id, "built": [], "passages": 0}
        done, passages = {}, 0
        for entry in missing:
            with sf() as session:
                rows = session.execute(
                    select(Passage.faiss_id, Passage.text, Passage.published).where(Passage.build_id == entry.build)
                ).all()
            if len(rows) != entry.count:
                raise IndexIntegrityError(
                    f"shard {entry.key}: {len(rows)} passage rows in the database, the "
                    f"manifest says {entry.count}; {REBUILD_HINT}"
                )
            ids = np.array([r.faiss_id for r in rows], dtype=np.int64)
            texts = [dated_text(r.text, r.published) for r in rows]  # what BM25 reads
            done[entry.key] = write_lexical(index_dir, entry, Bm25Shard.build(entry.key, texts, ids))
            passages += len(rows)
            log.info("BM25 index of shard %s: %d passages", entry.key, len(rows))
        new = Manifest.new(manifest.encoder, manifest.dim, [done.get(e.key, e) for e in manifest.shards])
        with sf() as session, session.begin():
            add_snapshot(session, index_dir, new)
    return {"snapshot": new.snapshot_id, "built": list(done), "passages": passages}
