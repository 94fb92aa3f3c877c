"""API replicas: two app processes' worth of state on one database and one index folder serve the
same answers, follow a snapshot committed elsewhere, and share their rate limits through Redis."""

from __future__ import annotations

import time

import pytest
from fastapi.testclient import TestClient

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from app.main import create_app
from tests.conftest import load_sample
from workers.ingest import ingest

REDIS_URL = "redis://127.0.0.1:6379/15"


def _redis_or_skip():
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        pytest.skip(f"no Redis at {REDIS_URL}")
    client.flushdb()  # this test's own database number: counts from an earlier run go
    return client


def test_two_replicas_answer_alike_and_both_follow_a_new_snapshot(make_settings, database_url):
    settings = make_settings(database_url=database_url, snapshot_poll_s=0.2)
    load_sample(settings, through="2024-02")
    body = {"question": "Who is the mayor of Port Calder?", "as_of": "2024-03-31", "top_k": 5}
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        first_a, first_b = a.post("/v1/answers", json=body).json(), b.post("/v1/answers", json=body).json()
        assert first_a["passages"] == first_b["passages"] and first_a["answer"] == first_b["answer"]
        old = a.get("/readyz").json()["snapshot"]
        db = open_database(settings, migrate=False)  # another process (the worker) ingests March
        try:
            job = ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"month": "2024-03"})
        finally:
            db.close()
        new = job.counts["2024-03"]["snapshot"]

        deadline = time.monotonic() + 30
        while {a.get("/readyz").json()["snapshot"], b.get("/readyz").json()["snapshot"]} != {new}:
            assert time.monotonic() < deadline, "a replica never picked up the new snapshot"
            time.sleep(0.1)
        late_a, late_b = a.post("/v1/answers", json=body).json(), b.post("/v1/answers", json=body).json()
        assert late_a["passages"] == late_b["passages"] != first_a["passages"]
        assert max(p["published"] for p in late_a["passages"]) >= "2024-03-01" and old != new


def test_replicas_share_one_rate_limit_through_redis(make_settings):
    _redis_or_skip()
    settings = make_settings(rate_limit="5/minute", limits_storage=REDIS_URL)
    load_sample(settings, through="2024-01")
    with TestClient(create_app(settings)) as a, TestClient(create_app(settings)) as b:
        codes = [client.get("/admin/jobs").status_code for client in (a, b, a, b, a)]  # 401s, but counted
        assert 429 not in codes
        over = b.get("/admin/jobs")
        assert over.status_code == 429 and "SQA_RATE_LIMIT" in over.json()["detail"]
        assert int(over.headers["retry-after"]) >= 1


def test_a_limits_storage_that_cannot_work_stops_the_app_with_the_setting_named(make_settings):
    with pytest.raises(ValueError, match="SQA_LIMITS_STORAGE='nosuch://x'"):
        create_app(make_settings(limits_storage="nosuch://x"))
