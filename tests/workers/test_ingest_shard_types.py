"""Ingest picks each shard's index type by size (SQA_IVF_*) and builds its BM25 file beside it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from app.main import create_app
from tests.conftest import load_sample


def test_ingest_builds_ivf_shards_above_the_threshold_and_serves_them(make_settings):
    settings = make_settings(ivf_min_vectors=20, ivf_compressed_min_vectors=10**6)
    load_sample(settings)
    with TestClient(create_app(settings)) as client:
        manifest = client.app.state.answers.index_state.current().manifest
        assert {e.index.kind for e in manifest.shards} == {"ivf-flat"}
        assert all(e.index.nlist >= 1 and e.bm25 is not None for e in manifest.shards)
        for as_of in ("2024-01-10", "2024-02-15", "2024-03-31"):
            r = client.post(
                "/v1/answers", json={"question": "Who is the mayor of Port Calder?", "as_of": as_of, "top_k": 20}
            )
            assert r.status_code == 200, r.text
            published = [p["published"] for p in r.json()["passages"]]
            assert published and max(published) <= as_of


def test_ingest_keeps_flat_shards_below_the_threshold(make_settings):
    settings = make_settings()  # the default threshold: 100,000 vectors
    load_sample(settings, through="2024-01")
    with TestClient(create_app(settings)) as client:
        manifest = client.app.state.answers.index_state.current().manifest
        assert [e.index.kind for e in manifest.shards] == ["flat"]
