"""Switching the index to another encoder: one new snapshot, the old one serving until it commits,
resumable, passage rows shared, and a server that follows the switch without a restart."""

from __future__ import annotations

import datetime as dt

import pytest

from app.bootstrap.builders import index_state, open_database
from app.bootstrap.job_configs import ingest_config
from indexer.manifest import read_manifest
from models.encoders import HashEncoder
from serving.index_state import latest_snapshot_row
from workers.reencode import reencode

ADMIN = {"X-Admin-Token": "test-admin-token"}


def _serving(settings):
    db = open_database(settings)
    try:
        with db.sessions() as session:
            row = latest_snapshot_row(session)
            return row, read_manifest(settings.index_dir, row.manifest_file)
    finally:
        db.close()


def _reencode(settings, encoder):
    db = open_database(settings)
    try:
        return reencode(db.sessions, encoder, ingest_config(settings))
    finally:
        db.close()


def test_reencode_commits_one_snapshot_whose_every_shard_records_the_new_encoder(loaded_settings):
    before_row, before = _serving(loaded_settings)
    job = _reencode(loaded_settings, HashEncoder(256))
    assert job.state == "succeeded" and job.counts["previous_encoder"] == "hash-384"
    row, after = _serving(loaded_settings)
    assert row.id == before_row.id + 1 and after.encoder == "hash-256" and after.dim == 256
    assert [e.key for e in after.shards] == [e.key for e in before.shards]
    assert all(
        e.encoder == "hash-256" and e.rows == b.build and e.bm25 == b.bm25 for e, b in zip(after.shards, before.shards)
    )
    assert after.total == before.total

    # SQA_ENCODER=auto: the snapshot carries its own query encoder; the answer cites the new encoder
    from app.bootstrap.builders import build_answer_service

    auto = loaded_settings.model_copy(update={"encoder": "auto"})
    db = open_database(auto)
    try:
        service = build_answer_service(auto, db, HashEncoder(384))
        service.index_state.refresh()
        assert service.index_state.current().encoder.name == "hash-256"
        result = service.answer("Who coaches the Harriers?", dt.date(2024, 3, 31))
        assert result.versions["encoder"] == "hash-256" and result.passages
    finally:
        db.close()


def test_reencode_progress_grows_shard_by_shard(loaded_settings, monkeypatch):
    """Each shard opens its own "encode" stage: the job's fraction must count shards done, not read
    100% once the first shard is encoded."""
    import workers.reencode as reencode_module

    seen = []
    real = reencode_module.encode_with_checkpoints

    def spy(encoder, texts, work, cfg, progress):
        seen.append(progress.progress.fraction)  # before this shard
        out = real(encoder, texts, work, cfg, progress)
        seen.append(progress.progress.fraction)  # after it
        return out

    monkeypatch.setattr(reencode_module, "encode_with_checkpoints", spy)
    _, before = _serving(loaded_settings)
    assert len(before.shards) >= 2
    job = _reencode(loaded_settings, HashEncoder(256))
    assert job.state == "succeeded" and job.progress == 1.0
    n = len(before.shards)
    assert len(seen) == 2 * n
    assert seen == sorted(seen) and seen[0] == 0.0
    assert seen[1] < 1.0 / n + 1e-9 and seen[-1] < 1.0  # one shard is 1/n of the work


def test_passage_rows_outlive_the_snapshot_that_wrote_them(loaded_settings):
    """A re-encoded shard points at the old shard's rows: garbage collection must keep them."""
    from workers.ingest import ingest

    db = open_database(loaded_settings)
    try:
        reencode(db.sessions, HashEncoder(256), ingest_config(loaded_settings))
        cfg = ingest_config(loaded_settings)
        for _ in range(cfg.keep_snapshots + 1):  # re-ingest the last month until the original snapshot is dropped
            ingest(db.sessions, HashEncoder(256), cfg, {"month": "2024-03"})
        auto = loaded_settings.model_copy(update={"encoder": "auto"})
        from app.bootstrap.builders import build_answer_service

        service = build_answer_service(auto, db, HashEncoder(256))
        service.index_state.refresh()
        result = service.answer("Who coaches the Harriers?", dt.date(2024, 2, 28))  # from the re-encoded shards
        assert result.passages and all(p.published <= dt.date(2024, 2, 28) for p in result.passages)
    finally:
        db.close()


class _Crashing(HashEncoder):
    def __init__(self, after: int):
        super().__init__(256)
        self.calls, self.after = 0, after

    def encode_passages(self, texts, *, batch_size=64):
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("encoder crashed")
        return super().encode_passages(texts, batch_size=batch_size)


def test_a_crash_leaves_the_old_snapshot_serving_and_a_rerun_resumes(make_settings):
    from tests.conftest import load_sample

    settings = make_settings(checkpoint_every=4, encode_batch_size=2)
    load_sample(settings)
    before_row, _ = _serving(settings)
    crashing = _Crashing(after=3)
    db = open_database(settings)
    try:
        with pytest.raises(RuntimeError, match="encoder crashed"):
            reencode(db.sessions, crashing, ingest_config(settings))
        row, manifest = _serving(settings)
        assert row.id == before_row.id and manifest.encoder == "hash-384"  # nothing switched
        again = _Crashing(after=10_000)
        job = reencode(db.sessions, again, ingest_config(settings))
        assert job.state == "succeeded"
        blocks = sum(-(-e.count // 4) for e in _serving(settings)[1].shards)  # checkpoint blocks of 4 passages
        assert again.calls == blocks - 3  # the 3 blocks checkpointed before the crash were not encoded again
        assert not list(settings.work_dir.glob("reencode-*"))
    finally:
        db.close()


def test_reencode_to_the_same_encoder_changes_nothing(loaded_settings):
    before_row, _ = _serving(loaded_settings)
    job = _reencode(loaded_settings, HashEncoder(384))
    assert job.state == "succeeded" and "already encoded" in job.message
    assert _serving(loaded_settings)[0].id == before_row.id


def test_a_server_on_auto_switches_encoders_through_the_admin_api(loaded_settings, wait_job):
    from fastapi.testclient import TestClient

    from app.main import create_app

    auto = loaded_settings.model_copy(update={"encoder": "auto"})
    with TestClient(create_app(auto)) as client:
        assert client.get("/admin/index", headers=ADMIN).json()["encoder"] == "hash-384"
        bad = client.post("/admin/index/reencode", json={"encoder": "dpr-nope"}, headers=ADMIN)
        assert bad.status_code == 422 and "dpr-nope" in bad.json()["detail"]
        assert client.post("/admin/index/reencode", json={"encoder": "../x"}, headers=ADMIN).status_code == 422
        started = client.post("/admin/index/reencode", json={"encoder": "hash-256"}, headers=ADMIN)
        assert started.status_code == 202
        job = wait_job(client, started.json()["job_id"])
        assert job["state"] == "succeeded", job
        assert client.get("/admin/index", headers=ADMIN).json()["encoder"] == "hash-256"
        answer = client.post("/v1/answers", json={"question": "Who coaches the Harriers?", "as_of": "2024-03-31"})
        assert answer.status_code == 200 and answer.json()["versions"]["encoder"] == "hash-256"
        listed = client.get("/admin/encoders", headers=ADMIN).json()
        assert [e["version"] for e in listed] == ["all-MiniLM-L6-v2"] and not listed[0]["serving"]


def test_a_pinned_server_refuses_to_switch(client):
    response = client.post("/admin/index/reencode", json={"encoder": "hash-256"}, headers=ADMIN)
    assert response.status_code == 409 and "SQA_ENCODER" in response.json()["detail"]


def test_cli_reencode_says_what_is_wrong(sqa):
    result = sqa("index", "reencode", "--encoder", "no-such-version")
    assert result.exit_code != 0 and "no-such-version" in result.output


def test_auto_state_refuses_an_index_whose_encoder_cannot_be_found(loaded_settings):
    from indexer.index_errors import IndexIntegrityError

    db = open_database(loaded_settings)
    try:
        with db.sessions() as session, session.begin():
            row = latest_snapshot_row(session)
        auto = loaded_settings.model_copy(update={"encoder": "auto"})

        def missing(name):
            raise ValueError(f"the index was encoded with {name!r}, which is not here")

        state = index_state(auto, db, HashEncoder(384))
        state._resolver = missing
        with pytest.raises(IndexIntegrityError, match="not here"):
            state.open(row)
    finally:
        db.close()
