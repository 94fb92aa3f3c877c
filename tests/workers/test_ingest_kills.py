"""kill -9 of an ingest at ten random points in one run: after every kill the previous snapshot
keeps serving with files and database agreeing, and the run that finally completes builds the same
month index as an uninterrupted one (the same passages of the same articles, the same vectors):
no article lost or duplicated."""

from __future__ import annotations

import os
import random
import signal
import time

import numpy as np
from sqlalchemy import func, select

from app.bootstrap.builders import open_database
from serving.index_state import IndexState
from store.tables import Article, Job, Passage
from tests import forked
from tests.conftest import load_sample
from tests.forked import ForkedRun, ForkServer
from tests.workers.test_ingest import snapshot_agrees_with_database

fork_server = forked.fork_server  # the module's warm fork server (a fixture)

MONTH = "2024-03"
KILLS = 10


def _env(settings) -> dict:
    # A slow hash encoder and small checkpoints, so that the month takes seconds and has many stages;
    # the CPU named, so that no run imports torch to look for a GPU.
    return {
        **os.environ,
        "SQA_HOME": str(settings.home),
        "SQA_DATABASE_URL": settings.db_url,
        "SQA_ENCODER": "hash:delay_ms=60",
        "SQA_CHECKPOINT_EVERY": "4",
        "SQA_ENCODE_BATCH_SIZE": "2",
        "SQA_READER": "first-entity",
        "SQA_ENV": "test",
        "SQA_AUTO_TRAIN": "false",
        "SQA_DEVICE": "cpu",
    }


def _ingest(server: ForkServer, settings) -> ForkedRun:
    """`sqa ingest --month MONTH --no-train`, forked warm (tests/forked.py): the run alone is timed and killed."""
    return server.start(_env(settings), argv=["ingest", "--month", MONTH, "--no-train"])


def month_index(settings) -> dict[tuple[str, int], tuple[str, np.ndarray]]:
    """The serving snapshot's MONTH shard: (article url, passage ordinal) -> (text, vector)."""
    db = open_database(settings, migrate=False)
    try:
        state = IndexState(db.sessions, settings.index_dir, encoder="hash-384", dim=384)
        state.refresh()
        shard = next(s for s in state.current().index.shards if s.key == MONTH)
        ids = shard.ids()
        with db.sessions() as s:
            rows = {
                r.faiss_id: r
                for r in s.execute(
                    select(Passage.faiss_id, Passage.ordinal, Passage.text, Article.url)
                    .join(Article, Article.id == Passage.article_id)
                    .where(Passage.faiss_id.in_(ids.tolist()))
                )
            }
        assert len(rows) == len(ids), "an indexed id has no passage row"
        out = {}
        for i in ids.tolist():
            r = rows[i]
            key = (r.url, r.ordinal)
            assert key not in out, f"passage {key} is indexed twice"
            out[key] = (r.text, shard._index.reconstruct(i))
        return out
    finally:
        db.close()


def test_ingest_killed_at_ten_random_points_then_equals_an_uninterrupted_run(
    production_settings, make_settings, tmp_path, fork_server
):
    server = fork_server
    settings = production_settings
    # The reference: the same month ingested once, uninterrupted, in a home of its own (timed).
    reference_settings = make_settings(home=tmp_path / "reference")
    load_sample(reference_settings, through="2024-02")
    code, out = _ingest(server, reference_settings).wait()
    assert code == 0, out
    reference = month_index(reference_settings)
    ref_db = open_database(reference_settings, migrate=False)
    with ref_db.sessions() as s:
        job = s.scalars(select(Job).where(Job.kind == "ingest").order_by(Job.id.desc())).first()
        work = (job.finished_at - job.started_at).total_seconds()  # the month's work, start-up excluded
    ref_db.close()
    assert len(reference) >= 8

    load_sample(settings, through="2024-02")
    old = snapshot_agrees_with_database(settings)
    db = open_database(settings, migrate=False)
    rng = random.Random(20241124)
    killed_at: list[str] = []
    try:
        for _ in range(3 * KILLS):
            if len(killed_at) == KILLS:
                break
            with db.sessions() as s:
                last = s.scalar(select(func.max(Job.id))) or 0
            proc = _ingest(server, settings)
            # Kill it a random moment into its work (from the job row's creation: chunking, encoding,
            # writing the shard, the commit); a run that ends first is not a kill, another is started.
            seen = None
            while proc.poll() is None and seen is None:
                with db.sessions() as s:
                    seen = s.scalars(select(Job.id).where(Job.id > last, Job.kind == "ingest")).first()
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 1.0) * work)
            with db.sessions() as s:
                job = s.get(Job, seen) if seen is not None else None
                seen = (job.progress or 0.0, job.message) if job is not None else None
            proc.kill()
            code, out = proc.wait(timeout=30)
            assert code in (0, -signal.SIGKILL), out
            if code != -signal.SIGKILL:  # it had finished
                continue
            killed_at.append("before its job row" if seen is None else f"{100 * seen[0]:.0f}% {seen[1]}")
            # What serves is whole: its files and the database agree, and it is the old snapshot or a complete one.
            row, total = snapshot_agrees_with_database(settings)
            assert (row, total) == old or total == old[1] + len(reference), killed_at
        assert len(killed_at) == KILLS, f"only {len(killed_at)} runs were killed before they ended"

        code, out = _ingest(server, settings).wait()  # the run that is let finish
        assert code == 0, out
    finally:
        db.close()
    print("killed at: " + " | ".join(killed_at))

    _, total = snapshot_agrees_with_database(settings)
    assert total == old[1] + len(reference)
    got = month_index(settings)
    assert got.keys() == reference.keys(), "articles lost or passages changed"
    for key, (text, vector) in reference.items():
        assert got[key][0] == text
        np.testing.assert_allclose(got[key][1], vector, rtol=0, atol=1e-6)
