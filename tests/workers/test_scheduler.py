"""The scheduler: a run missed while the worker was down runs once on start (coalesced) within the
misfire grace and is dropped outside it; jobs persist in the job store across restarts and keep a
missed run; the worker stops cleanly on SIGTERM; the admin schedule routes."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED, EVENT_JOB_MISSED
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select, table

from app.api.routes import schedule
from app.bootstrap.builders import open_database
from app.bootstrap.job_configs import scheduler_config
from app.main import create_app
from store.tables import Job
from workers import scheduled as jobs
from workers.scheduler import WorkerScheduler, trigger_now
from workers.scheduler import build_scheduler as build_from_config
from workers.scheduler import scheduled_jobs as scheduled_from_config


def build_scheduler(settings, **kwargs):
    return build_from_config(scheduler_config(settings), **kwargs)


def scheduled_jobs(settings):
    return scheduled_from_config(scheduler_config(settings))


ROOT = Path(__file__).resolve().parents[2]
UTC = dt.UTC
# February 29 only: the real jobs never fall due while a test runs.
RARE = dict(ingest_cron="0 0 29 2 *", eval_cron="0 0 29 2 *")
ADMIN = {"X-Admin-Token": "test-admin-token"}


def record_run(path: str) -> None:
    """The probe job: one line per run."""
    with open(path, "a") as fh:
        fh.write(f"{time.time()}\n")


PROBE_REF = f"{__name__}:record_run"  # the module as pytest imported it, so the job store can resolve it


def store_missed_probe(settings, runs: Path) -> None:
    """Store a 45-minute job last due 2 hours ago (three runs missed: -2h, -1h15, -30min) and stop.

    A WorkerScheduler: a plain BackgroundScheduler would process (and lose) the due job once more
    on shutdown, paused or not."""
    sched = build_scheduler(settings, scheduler_cls=WorkerScheduler)
    sched.start(paused=True)
    sched.add_job(
        PROBE_REF,
        IntervalTrigger(minutes=45, timezone=UTC),
        id="probe",
        args=[str(runs)],
        next_run_time=dt.datetime.now(UTC) - dt.timedelta(hours=2),
    )
    sched.shutdown()


def start_until_probe_event(settings) -> tuple[list[int], dt.datetime]:
    """Start a scheduler, wait (bounded) for the probe's first event and a little longer; stop."""
    sched = build_scheduler(settings, scheduler_cls=BackgroundScheduler)
    codes: list[int] = []
    seen = threading.Event()

    def listen(event) -> None:
        if event.job_id == "probe":
            codes.append(event.code)
            seen.set()

    sched.add_listener(listen, EVENT_JOB_EXECUTED | EVENT_JOB_MISSED | EVENT_JOB_ERROR)
    sched.start()
    try:
        assert seen.wait(15), "the missed probe job neither ran nor was reported missed"
        time.sleep(0.5)  # room for a wrong second run
        next_run = sched.get_job("probe").next_run_time
    finally:
        sched.shutdown(wait=True)
    return codes, next_run


def test_build_scheduler_runs_a_missed_job_once_on_start(make_settings, tmp_path):
    settings = make_settings(**RARE)  # the real defaults: misfire grace 6 h, coalesce
    runs = tmp_path / "runs.txt"
    store_missed_probe(settings, runs)
    codes, next_run = start_until_probe_event(settings)
    assert codes == [EVENT_JOB_EXECUTED]
    assert len(runs.read_text().splitlines()) == 1  # three missed periods, one run
    assert next_run > dt.datetime.now(UTC)


def test_build_scheduler_with_one_second_grace_drops_the_missed_run(make_settings, tmp_path):
    settings = make_settings(misfire_grace_s=1, **RARE)  # APScheduler's own default
    runs = tmp_path / "runs.txt"
    store_missed_probe(settings, runs)
    codes, _ = start_until_probe_event(settings)
    assert codes == [EVENT_JOB_MISSED]
    assert not runs.exists()


def test_scheduled_jobs_persist_across_restarts(make_settings):
    settings = make_settings(**RARE)
    assert scheduled_jobs(settings) == []  # no worker has run yet
    for _ in range(2):  # start and stop twice: the second start finds the stored jobs
        sched = build_scheduler(settings, scheduler_cls=WorkerScheduler)
        sched.start(paused=True)
        sched.shutdown()
    listed = {j["id"]: j for j in scheduled_jobs(settings)}
    assert set(listed) == {"monthly-ingest", "quarterly-evaluation"}
    for job in listed.values():
        assert job["trigger"].startswith("cron[") and "day='29'" in job["trigger"]
        when = dt.datetime.fromisoformat(job["next_run_time"])
        assert when.utcoffset() == dt.timedelta(0) and when > dt.datetime.now(UTC)
    engine = create_engine(settings.db_url)
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(table("apscheduler_jobs"))) == 2
    engine.dispose()


def test_build_scheduler_keeps_a_stored_missed_run_unless_the_cron_changed(make_settings):
    settings = make_settings(**RARE)
    missed = (dt.datetime.now(UTC) - dt.timedelta(hours=1)).replace(microsecond=0)
    sched = build_scheduler(settings, scheduler_cls=WorkerScheduler)
    sched.start(paused=True)
    sched.modify_job("monthly-ingest", next_run_time=missed)  # as if the worker was down when it fell due
    sched.shutdown()

    sched = build_scheduler(settings, scheduler_cls=WorkerScheduler)
    sched.start(paused=True)  # paused: nothing runs
    kept = sched.get_job("monthly-ingest").next_run_time
    sched.shutdown()
    assert kept == missed  # replace_existing alone would have moved it to the next 29 February

    changed = make_settings(ingest_cron="0 0 28 2 *", eval_cron=RARE["eval_cron"])
    sched = build_scheduler(changed, scheduler_cls=WorkerScheduler)
    sched.start(paused=True)
    job = sched.get_job("monthly-ingest")
    sched.shutdown()
    assert "day='28'" in str(job.trigger) and job.next_run_time > dt.datetime.now(UTC)


def test_background_scheduler_loses_a_due_run_when_shut_down_paused(make_settings):
    """Why run_worker uses WorkerScheduler (if APScheduler fixes this, WorkerScheduler can go)."""
    settings = make_settings(**RARE)
    missed = (dt.datetime.now(UTC) - dt.timedelta(hours=1)).replace(microsecond=0)
    sched = build_scheduler(settings, scheduler_cls=BackgroundScheduler)
    sched.start(paused=True)
    sched.modify_job("monthly-ingest", next_run_time=missed)
    sched.shutdown()
    [stored] = [j for j in scheduled_jobs(settings) if j["id"] == "monthly-ingest"]
    assert dt.datetime.fromisoformat(stored["next_run_time"]) > dt.datetime.now(UTC)


def test_build_scheduler_rejects_a_bad_cron(make_settings):
    from serving.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="SQA_INGEST_CRON"):
        build_scheduler(make_settings(ingest_cron="every month"), scheduler_cls=BackgroundScheduler)


def test_trigger_now_unknown_id_names_the_valid_ids():
    from serving.errors import NotFoundError

    with pytest.raises(NotFoundError, match="monthly-ingest, quarterly-evaluation"):
        trigger_now(None, "weekly-ingest")


def test_run_worker_stops_cleanly_on_sigterm(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQA_")}
    env.update(
        SQA_HOME=str(tmp_path / "home"),
        SQA_ENV="test",
        SQA_ENCODER="hash",
        SQA_READER="first-entity",
        SQA_INGEST_CRON=RARE["ingest_cron"],
        SQA_EVAL_CRON=RARE["eval_cron"],
    )
    code = "from settings import get_settings; from app.bootstrap import run_worker; run_worker(get_settings())"
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "worker running" in line:
                break
        assert any("worker running" in x for x in lines), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, "".join(lines) + rest
    assert "worker stopped" in rest


# ---- the admin routes ------------------------------------------------------------------------------


@pytest.fixture
def schedule_client(make_settings):
    settings = make_settings(**RARE)
    app = create_app(settings)
    app.include_router(schedule.router)
    with TestClient(app) as client:
        yield client, settings


def test_schedule_routes_require_the_admin_token(schedule_client):
    client, _ = schedule_client
    assert client.get("/admin/schedule").status_code == 401
    assert client.post("/admin/schedule/monthly-ingest/run").status_code == 401


def test_schedule_list_shows_next_runs_and_history(schedule_client):
    client, settings = schedule_client
    before = {j["id"]: j for j in client.get("/admin/schedule", headers=ADMIN).json()}
    assert set(before) == {"monthly-ingest", "quarterly-evaluation"}
    assert before["monthly-ingest"]["scheduled"] is False and before["monthly-ingest"]["next_run_time"] is None

    sched = build_scheduler(settings, scheduler_cls=WorkerScheduler)  # what `sqa worker` stores
    sched.start(paused=True)
    sched.shutdown()
    db = open_database(settings, migrate=False)
    with db.sessions() as session, session.begin():
        session.add(
            Job(
                kind="monthly-ingest",
                params={"period": "2024-02"},
                state="failed",
                error="boom",
                message="",
                counts={},
                timings={},
            )
        )
    db.close()

    after = {j["id"]: j for j in client.get("/admin/schedule", headers=ADMIN).json()}
    ingest = after["monthly-ingest"]
    assert ingest["scheduled"] is True and ingest["cron"] == RARE["ingest_cron"]
    assert dt.datetime.fromisoformat(ingest["next_run_time"].replace("Z", "+00:00")) > dt.datetime.now(UTC)
    assert [(h["state"], h["period"], h["error"]) for h in ingest["history"]] == [("failed", "2024-02", "boom")]
    assert after["quarterly-evaluation"]["history"] == []


def test_schedule_run_now_starts_the_job_in_the_background(schedule_client, monkeypatch):
    client, _ = schedule_client
    ran = threading.Event()
    periods: list[str | None] = []

    def fake(ctx, period=None):
        periods.append(period)
        ran.set()
        return {}

    monkeypatch.setitem(jobs.JOBS, "monthly-ingest", fake)
    resp = client.post("/admin/schedule/monthly-ingest/run", params={"period": "2024-02"}, headers=ADMIN)
    assert resp.status_code == 202
    assert resp.json()["kind"] == "monthly-ingest" and resp.json()["status_url"] == "/admin/jobs"
    assert ran.wait(10)
    assert periods == ["2024-02"]


def test_schedule_run_now_rejects_unknown_ids_bad_periods_and_a_second_run(schedule_client):
    client, settings = schedule_client
    resp = client.post("/admin/schedule/weekly-ingest/run", headers=ADMIN)
    assert resp.status_code == 404
    assert "monthly-ingest" in resp.json()["detail"] and "quarterly-evaluation" in resp.json()["detail"]
    assert (
        client.post("/admin/schedule/quarterly-evaluation/run", params={"period": "2023Q5"}, headers=ADMIN).status_code
        == 422
    )
    bad_cut = client.post("/admin/schedule/weekly-adaptation/run", params={"period": "2024-03"}, headers=ADMIN)
    assert bad_cut.status_code == 422 and "is not a day (use YYYY-MM-DD" in bad_cut.json()["detail"]
    with client.app.state.jobs.runner.lock("monthly-ingest").hold():  # as if another process ran it
        assert client.post("/admin/schedule/monthly-ingest/run", headers=ADMIN).status_code == 409
