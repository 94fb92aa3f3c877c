"""The Ray backfill (`sqa ingest --executor ray`): a local Ray cluster encodes the months, and the
index equals the one the local path builds (same shards, ids and vectors); a rerun encodes only
what is missing."""

from __future__ import annotations

import numpy as np
import pytest

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from indexer.importers import read_realtimeqa
from models.encoders import HashEncoder
from serving.index_state import IndexState
from tests.conftest import SAMPLE
from workers.imports import store_records
from workers.ingest import ingest
from workers.ingest_plans import IngestParams

ray = pytest.importorskip("ray")


class CountingEncoder(HashEncoder):
    def __init__(self) -> None:
        super().__init__()
        self.encoded = 0

    def encode_passages(self, texts, *, batch_size=64):
        self.encoded += len(texts)
        return super().encode_passages(texts, batch_size=batch_size)


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def _home(settings):
    db = open_database(settings)
    articles, questions, _ = read_realtimeqa(SAMPLE)
    store_records(db.sessions, articles, questions)
    return db


def _index(settings, db) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    state = IndexState(db.sessions, settings.index_dir, encoder="hash-384", dim=384)
    state.refresh()
    return {
        s.key: (s.ids(), np.vstack([s._index.reconstruct(int(i)) for i in s.ids()]))
        for s in state.current().index.shards
    }


def test_a_ray_backfill_builds_the_index_the_local_path_builds(local_ray, make_settings, tmp_path):
    from workers.backfill_ray import fill_checkpoints

    params = IngestParams.parse({"through": "2024-03"})
    local = make_settings(home=tmp_path / "local", encoder="hash", checkpoint_every=8)
    db = _home(local)
    try:
        ingest(db.sessions, build_encoder(local), ingest_config(local), params)
        expected = _index(local, db)
    finally:
        db.close()

    remote = make_settings(home=tmp_path / "ray", encoder="hash", checkpoint_every=8)
    db = _home(remote)
    try:
        filled = fill_checkpoints(db.sessions, HashEncoder(), ingest_config(remote), params)
        assert filled["encoded"] == filled["passages"] > 0 and filled["actors"] == 2 and filled["blocks"] > 2
        counting = CountingEncoder()
        job = ingest(db.sessions, counting, ingest_config(remote), params)
        assert job.state == "succeeded"
        assert counting.encoded == 0  # every passage came from the Ray actors' checkpoints
        got = _index(remote, db)
    finally:
        db.close()
    assert got.keys() == expected.keys()
    for key, (ids, vectors) in expected.items():
        np.testing.assert_array_equal(got[key][0], ids)
        np.testing.assert_allclose(got[key][1], vectors, rtol=0, atol=1e-6)


def test_a_rerun_encodes_only_the_blocks_still_missing(local_ray, make_settings, tmp_path):
    from workers.backfill_ray import fill_checkpoints, pending_blocks

    params = IngestParams.parse({"through": "2024-03"})
    settings = make_settings(home=tmp_path / "home", encoder="hash", checkpoint_every=8)
    db = _home(settings)
    try:
        cfg = ingest_config(settings)
        first = fill_checkpoints(db.sessions, HashEncoder(), cfg, params)
        blocks, _ = pending_blocks(db.sessions, HashEncoder(), cfg, params)
        assert blocks == []
        lost = sorted(cfg.work_dir.glob("ingest-2024-02-*/emb-*.npy"))[0]  # as if its worker died before saving
        lost.unlink()
        again = fill_checkpoints(db.sessions, HashEncoder(), cfg, params)
        assert again["blocks"] == 1 and 0 < again["encoded"] <= 8 and again["passages"] == first["passages"]
        assert fill_checkpoints(db.sessions, HashEncoder(), cfg, params)["encoded"] == 0
    finally:
        db.close()


def test_sqa_ingest_with_the_ray_executor_end_to_end(local_ray, sqa, sample_root):
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    out = sqa("ingest", "--through", "2024-03", "--executor", "ray", "--actors", "2", "--no-train")
    assert out.exit_code == 0, out.output
    assert "ray: 72 of 72 planned passages encoded now" in out.output
    assert "2024-03: 12 articles -> 24 passages" in out.output
    bad = sqa("ingest", "--through", "2024-03", "--executor", "dask")
    assert bad.exit_code == 2 and "--executor must be local or ray" in bad.output
