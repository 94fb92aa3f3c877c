"""Concurrency at the API: one ingest at a time whoever asks, and answers that never fail while
the index swaps snapshots under them."""

from __future__ import annotations

import threading
import time

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from app.main import create_app
from serving.errors import ConflictError
from store.tables import Job
from tests.conftest import load_sample
from workers.ingest import ingest

ADMIN = {"X-Admin-Token": "test-admin-token"}


@pytest.fixture
def slow_client(make_settings, database_url):
    """The sample through 2024-03, served with a hash encoder slowed down (an ingest takes seconds).
    No rate limit: eight clients on one address send far more than SQA_RATE_LIMIT's 600 a minute, and
    a 429 by design is not what these tests are about; nor is the answer gate's 503 (eight places)."""
    settings = make_settings(
        database_url=database_url, encoder="hash:delay_ms=40", encode_batch_size=2, rate_limit="", answer_concurrency=8
    )
    load_sample(settings)
    with TestClient(create_app(settings)) as client:
        yield client, settings
        client.app.state.jobs.runner.wait_all(timeout=120)


def _ingest_jobs(settings) -> int:
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            return s.scalar(select(func.count()).select_from(Job).where(Job.kind == "ingest"))
    finally:
        db.close()


def test_two_ingests_of_a_month_at_once_one_runs_the_other_is_told_409(slow_client, wait_job):
    client, settings = slow_client
    before = _ingest_jobs(settings)
    first = client.post("/admin/ingest", json={"month": "2024-03"}, headers=ADMIN)
    second = client.post("/admin/ingest", json={"month": "2024-03"}, headers=ADMIN)
    assert first.status_code == 202, first.text
    assert second.status_code == 409, second.text
    assert "an ingest is already running" in second.json()["detail"]
    # another process (the CLI) is refused by the index's lock while the server's ingest runs
    db = open_database(settings, migrate=False)
    try:
        with pytest.raises(ConflictError, match="another ingest is running"):
            ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"month": "2024-03"})
    finally:
        db.close()
    assert wait_job(client, first.json()["job_id"], timeout=120)["state"] == "succeeded"
    assert _ingest_jobs(settings) == before + 1  # one job row: the refused ones made none


def test_answers_from_eight_clients_never_fail_while_snapshots_swap(slow_client, wait_job):
    client, _ = slow_client
    stop = threading.Event()
    outcomes: list[tuple[int, int]] = []  # (status, passages)
    lock = threading.Lock()

    def ask(i: int) -> None:
        while not stop.is_set():
            r = client.post(
                "/v1/answers",
                json={"question": "Who is the mayor of Port Calder?", "as_of": "2024-03-31", "top_k": 1 + i % 10},
            )
            with lock:
                outcomes.append((r.status_code, len(r.json().get("passages", [])) if r.status_code == 200 else 0))

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    snapshots = {client.get("/readyz").json()["snapshot"]}
    try:
        for month in ("2024-01", "2024-02", "2024-03"):  # three re-ingests: three swaps under load
            r = client.post("/admin/ingest", json={"month": month}, headers=ADMIN)
            assert r.status_code == 202, r.text
            assert wait_job(client, r.json()["job_id"], timeout=120)["state"] == "succeeded"
            deadline = time.monotonic() + 10
            while client.get("/readyz").json()["snapshot"] in snapshots and time.monotonic() < deadline:
                time.sleep(0.05)
            snapshots.add(client.get("/readyz").json()["snapshot"])
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert len(snapshots) == 4  # served the first and each of the three new ones
    statuses = sorted({s for s, _ in outcomes})
    assert statuses == [200], f"non-200 answers during the swaps: {statuses}"
    assert len(outcomes) >= 24 and all(n >= 1 for _, n in outcomes)


def _job_state(settings, job_id: int) -> str:
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            return s.get(Job, job_id).state
    finally:
        db.close()


def test_shutdown_lets_a_background_job_finish_before_the_database_closes(loaded_settings):
    finished = threading.Event()

    def work(handle):
        time.sleep(0.5)  # still running when the client leaves
        handle.update(message="last words")
        finished.set()
        return "ok"

    with TestClient(create_app(loaded_settings)) as client:
        job_id = client.app.state.jobs.runner.submit("probe", {}, work, slot="probe")
    assert finished.is_set()  # the lifespan's shutdown waited for it
    assert _job_state(loaded_settings, job_id) == "succeeded"


def test_shutdown_waits_no_longer_than_it_is_told_and_names_the_job_left_running(make_settings, caplog):
    settings = make_settings(shutdown_wait_s=0.2)
    load_sample(settings)
    release = threading.Event()
    client = TestClient(create_app(settings)).__enter__()
    runner = client.app.state.jobs.runner
    job_id = runner.submit("probe", {}, lambda handle: release.wait(30), slot="probe")
    try:
        with caplog.at_level("WARNING", logger="app"):
            client.__exit__(None, None, None)  # the lifespan's shutdown, with the job still waiting
    finally:
        release.set()
        runner.wait_all(timeout=30)
    assert f"1 background job(s) still run: probe-{job_id}" in caplog.text
