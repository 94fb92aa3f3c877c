"""Old serving snapshots lose their rows with their files: a live stream publishes a snapshot every
few seconds, and the table of snapshots must not grow with every one of them."""

from __future__ import annotations

import os
import time

from sqlalchemy import func, select

from app.bootstrap.builders import open_database
from app.bootstrap.job_configs import ingest_config
from indexer.storage import as_store
from models.encoders import HashEncoder
from serving.index_state import latest_snapshot_row
from store.tables import IndexSnapshot
from workers.ingest import collect_garbage, ingest


def _age_every_file(folder, seconds: float) -> None:
    old = time.time() - seconds
    for root, _, files in os.walk(folder):
        for name in files:
            os.utime(os.path.join(root, name), (old, old))


def test_rows_of_collected_snapshots_go_with_their_manifests(loaded_settings):
    db = open_database(loaded_settings)
    try:
        cfg = ingest_config(loaded_settings)
        for _ in range(cfg.keep_snapshots + 2):  # more serving snapshots than are kept
            ingest(db.sessions, HashEncoder(), cfg, {"month": "2024-03"})
        with db.sessions() as session:
            before = session.scalar(select(func.count()).select_from(IndexSnapshot))
            newest = latest_snapshot_row(session).snapshot_id
        assert before > cfg.keep_snapshots  # young files: nothing was collected yet

        _age_every_file(loaded_settings.index_dir, 2 * 3600)  # older than garbage_files' min age
        collect_garbage(db.sessions, cfg)

        store = as_store(cfg.index_dir)
        with db.sessions() as session:
            rows = session.scalars(select(IndexSnapshot).where(IndexSnapshot.kind == "serving")).all()
            assert len(rows) == cfg.keep_snapshots
            assert latest_snapshot_row(session).snapshot_id == newest
        assert all(store.exists(r.manifest_file) for r in rows)  # every row left can still be opened
    finally:
        db.close()
