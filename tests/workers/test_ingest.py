"""Ingest: shards and snapshots agree with the database, re-ingest replaces, bad input changes nothing,
and a process killed half-way leaves the previous snapshot serving and the month resumable."""

from __future__ import annotations

import dataclasses
import datetime as dt
import os
import signal
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import numpy as np
import pytest
from sqlalchemy import func, select

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from indexer.importers import read_realtimeqa
from indexer.lexical import Bm25Shard, tokenize
from indexer.manifest import read_manifest
from models.encoders import HashEncoder
from serving.errors import InvalidInputError, NoArticlesError
from serving.index_state import IndexState, latest_snapshot_row
from store.tables import IndexSnapshot, Job, Passage
from tests.conftest import SAMPLE, load_sample
from workers.imports import store_records
from workers.ingest import ingest

ROOT = Path(__file__).resolve().parents[2]


def snapshot_agrees_with_database(settings) -> tuple[int, int]:
    """Open the newest snapshot (checksums verified) and check its ids are exactly the live passages."""
    db = open_database(settings, migrate=False)
    try:
        state = IndexState(db.sessions, settings.index_dir, encoder="hash-384", dim=384)
        state.refresh()
        snap = state.current()
        ids = np.concatenate([s.ids() for s in snap.index.shards])
        builds = [PurePosixPath(e.file).name for e in snap.manifest.shards]
        with db.sessions() as s:
            rows = s.execute(select(Passage.faiss_id, Passage.published).where(Passage.build_id.in_(builds))).all()
        assert sorted(ids.tolist()) == sorted(r.faiss_id for r in rows)
        assert len(ids) == snap.manifest.total
        return snap.row_id, len(ids)
    finally:
        db.close()


def test_ingest_through_builds_one_shard_per_month(settings):
    job = load_sample(settings)
    assert job.state == "succeeded" and job.counts["planned"] == ["2024-01", "2024-02", "2024-03"]
    manifest_keys = None
    db = open_database(settings, migrate=False)
    with db.sessions() as s:
        row = latest_snapshot_row(s)
        manifest_keys = [e.key for e in read_manifest(settings.index_dir, row.manifest_file).shards]
        n_snapshots = s.scalar(select(func.count()).select_from(IndexSnapshot))
    db.close()
    assert manifest_keys == ["2024-01", "2024-02", "2024-03"]
    assert n_snapshots == 3  # one snapshot per month, in order
    snapshot_agrees_with_database(settings)


def test_ingest_history_backfill_before_first_month(settings):
    db = open_database(settings)
    articles, questions, _ = read_realtimeqa(SAMPLE)
    store_records(db.sessions, articles, questions)
    job = ingest(
        db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2024-03", "from": "2024-02"}
    )
    db.close()
    assert job.counts["planned"] == ["history-2024-02", "2024-02", "2024-03"]
    _, total = snapshot_agrees_with_database(settings)
    assert total == sum(job.counts[k]["passages"] for k in job.counts["planned"])


def test_ingest_through_fills_a_month_skipped_between_indexed_ones(sqlite_settings):
    """The demo's order: the first month, then the newest (to answer at once), then `--through` with no
    --from indexes the month between them (from the first month the index covers), once."""
    settings = sqlite_settings
    db = open_database(settings)
    articles, questions, _ = read_realtimeqa(SAMPLE)
    store_records(db.sessions, articles, questions)
    encoder, cfg = build_encoder(settings), ingest_config(settings)
    jobs = [ingest(db.sessions, encoder, cfg, {"month": m}) for m in ("2024-01", "2024-03")]
    jobs.append(ingest(db.sessions, encoder, cfg, {"through": "2024-03"}))
    again = ingest(db.sessions, encoder, cfg, {"through": "2024-03"})
    db.close()
    assert [job.counts["planned"] for job in jobs] == [["2024-01"], ["2024-03"], ["2024-02"]]
    assert again.counts["planned"] == []
    _, total = snapshot_agrees_with_database(settings)
    assert total == sum(job.counts[k]["passages"] for job in jobs for k in job.counts["planned"])


def test_ingest_again_replaces_the_month_without_duplicates(settings):
    load_sample(settings)
    _, before = snapshot_agrees_with_database(settings)
    db = open_database(settings, migrate=False)
    job = ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"month": "2024-02"})
    again = ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2024-03"})
    db.close()
    assert job.state == "succeeded"
    assert again.counts["planned"] == []  # every month already indexed: nothing to do
    _, after = snapshot_agrees_with_database(settings)
    assert after == before


@pytest.mark.parametrize(
    "params, error, fragment",
    [
        ({"month": "2031-01"}, NoArticlesError, "no articles published in 2031-01"),
        ({"month": "2024-1"}, ValueError, "is not a month"),
        ({}, InvalidInputError, "needs a month"),
    ],
)
def test_ingest_bad_request_changes_nothing(settings, params, error, fragment):
    load_sample(settings)
    before = snapshot_agrees_with_database(settings)
    db = open_database(settings, migrate=False)
    with pytest.raises(error, match=fragment):
        ingest(db.sessions, build_encoder(settings), ingest_config(settings), params)
    with db.sessions() as s:
        jobs = s.scalar(select(func.count()).select_from(Job))
    db.close()
    assert jobs == 1  # the failed request left no job row behind
    assert snapshot_agrees_with_database(settings) == before


def test_ingest_month_inside_history_is_refused(settings):
    db = open_database(settings)
    articles, questions, _ = read_realtimeqa(SAMPLE)
    store_records(db.sessions, articles, questions)
    ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2024-03", "from": "2024-03"})
    with pytest.raises(InvalidInputError, match="lies inside shard"):
        ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"month": "2024-01"})
    db.close()


def test_import_twice_is_idempotent(settings):
    db = open_database(settings)
    articles, questions, _ = read_realtimeqa(SAMPLE)
    first = store_records(db.sessions, articles, questions)
    second = store_records(db.sessions, articles, questions)
    db.close()
    assert first.articles.inserted == len(articles) and first.questions.inserted == len(questions)
    assert second.articles.inserted == 0 and second.articles.unchanged == len(articles)
    assert second.questions.inserted == 0 and second.questions.unchanged == len(questions)


class CountingEncoder(HashEncoder):
    def __init__(self):
        super().__init__()
        self.encoded = 0

    def encode_passages(self, texts, *, batch_size=64):
        self.encoded += len(texts)
        return super().encode_passages(texts, batch_size=batch_size)


def test_ingest_killed_half_way_keeps_old_snapshot_and_resumes(settings):
    load_sample(settings, through="2024-02")
    old_row, old_total = snapshot_agrees_with_database(settings)
    env = {
        **os.environ,
        "SQA_HOME": str(settings.home),
        "SQA_DATABASE_URL": settings.db_url,
        "SQA_ENCODER": "hash:delay_ms=150",
        "SQA_CHECKPOINT_EVERY": "4",
        "SQA_ENCODE_BATCH_SIZE": "2",
        "SQA_READER": "first-entity",
        "SQA_ENV": "test",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "ingest", "--month", "2024-03"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    work = settings.work_dir
    deadline = time.monotonic() + 60
    while not list(work.glob("ingest-2024-03-*/emb-sorted-000001.npy")):
        assert proc.poll() is None, proc.stdout.read().decode()
        assert time.monotonic() < deadline, "the ingest never checkpointed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    checkpointed = len(list(work.glob("ingest-2024-03-*/emb-*.npy")))
    assert checkpointed >= 2

    # The previous snapshot still serves, and its files and the database agree.
    assert snapshot_agrees_with_database(settings) == (old_row, old_total)
    db = open_database(settings, migrate=False)
    with db.sessions() as s:
        killed = s.scalars(select(Job).order_by(Job.id.desc())).first()
        assert killed.state == "running"  # nobody could record its death
        assert s.scalar(select(func.count()).select_from(Passage).where(Passage.shard_key == "2024-03")) == 0

    # Running the same month again resumes from the checkpoints and completes.
    encoder = CountingEncoder()
    cfg = dataclasses.replace(ingest_config(settings), checkpoint_every=4, batch_size=2)  # as the killed run
    job = ingest(db.sessions, encoder, cfg, {"month": "2024-03"})
    with db.sessions() as s:
        assert s.get(Job, killed.id).state == "interrupted"
    db.close()
    assert job.state == "succeeded"
    total_passages = job.counts["2024-03"]["passages"]
    assert encoder.encoded == total_passages - checkpointed * 4
    _, new_total = snapshot_agrees_with_database(settings)
    assert new_total == old_total + total_passages
    assert not list(work.glob("ingest-2024-03-*"))  # the checkpoints are cleaned up after the commit


def _old_stored_text(body: str, day: dt.date) -> str:
    """A passage's text as chunking stored it before migration 0007, spelt out here."""
    return f"{day:%A}, {day:%B} {day.day}, {day.year}. {body}"


def test_ingest_stores_bodies_and_encodes_and_indexes_the_old_dated_text(sqlite_settings):
    """Passages are stored without their date, but the vectors and BM25 scores are those of the
    dated text stored before: the encoder's and BM25's input did not change."""
    load_sample(sqlite_settings)
    db = open_database(sqlite_settings, migrate=False)
    try:
        state = IndexState(db.sessions, sqlite_settings.index_dir, encoder="hash-384", dim=384, lexical=True)
        state.refresh()
        snap = state.current()
        with db.sessions() as s:
            rows = {r.faiss_id: r for r in s.execute(select(Passage.faiss_id, Passage.text, Passage.published))}
        encoder, as_of = build_encoder(sqlite_settings), dt.date(2024, 3, 31)
        assert not any(r.text.startswith(_old_stored_text("", r.published)) for r in rows.values())
        for shard, lexical in zip(snap.index.shards, snap.lexical.shards, strict=True):
            ids, vectors = shard.vectors()  # (n,), (n, dim)
            old = [_old_stored_text(rows[i].text, rows[i].published) for i in ids.tolist()]
            np.testing.assert_array_equal(vectors, encoder.encode_passages(old).astype(np.float32))
            before = Bm25Shard.build(shard.key, old, ids)
            for question in ("Who won the final?", "What happened on Thursday in February?"):
                tokens = tokenize([question])[0]
                got, want = lexical.search_tokens(tokens, 10, as_of), before.search_tokens(tokens, 10, as_of)
                np.testing.assert_array_equal(got[1], want[1])
                np.testing.assert_array_equal(got[0], want[0])
    finally:
        db.close()


class LengthsSeen(HashEncoder):
    """The hash encoder, noting the lengths of the texts of each call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[list[int]] = []

    def encode_passages(self, texts, batch_size=0):
        self.calls.append([len(t) for t in texts])
        return super().encode_passages(texts, batch_size=batch_size)


def test_passages_are_encoded_longest_first_and_returned_in_their_order(tmp_path):
    """Blocks of about one length (less padding in every batch); the vectors come back in the texts'
    order, and a resumed run reads the saved blocks back into the same places."""
    from workers.config import IngestConfig
    from workers.ingest import encode_with_checkpoints
    from workers.progress import NullProgress

    rng = np.random.default_rng(0)
    texts = [" ".join(f"w{i}x{j}" for j in range(int(n))) for i, n in enumerate(rng.integers(1, 60, size=23))]
    cfg = IngestConfig(index_dir=tmp_path / "index", work_dir=tmp_path / "work", checkpoint_every=5)
    encoder = LengthsSeen()
    vectors = encode_with_checkpoints(encoder, texts, tmp_path / "work" / "x", cfg, NullProgress())
    np.testing.assert_allclose(vectors, HashEncoder().encode_passages(texts), rtol=1e-6)
    seen = [n for call in encoder.calls for n in call]
    assert seen == sorted((len(t) for t in texts), reverse=True)  # longest first, across the blocks
    assert [len(c) for c in encoder.calls] == [5, 5, 5, 5, 3]
    again = LengthsSeen()
    resumed = encode_with_checkpoints(again, texts, tmp_path / "work" / "x", cfg, NullProgress())
    assert again.calls == [] and np.array_equal(resumed, vectors)  # every block read back, in place
