"""Several `sqa worker`s on one database: each scheduled run executes once, and a worker killed
mid-run leaves the period to another, which takes it over.

The workers are real processes (multiprocessing, spawn) running `workers.scheduled.monthly_ingest`
as the scheduler calls it (`wait_s`: they wait for each other). On PostgreSQL they coordinate with
advisory locks (workers on several machines); on SQLite with file locks under SQA_HOME (one machine).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import pytest
from sqlalchemy import select

from app.bootstrap import open_context
from app.bootstrap.builders import open_database
from store.tables import Job
from workers.locks import AdvisoryLock, JobLock
from workers.scheduled import MONTHLY_INGEST

PERIODS = [f"{2031 + i // 12}-{i % 12 + 1:02d}" for i in range(20)]  # 20 months with no news


def _slow_months(delay_s: float) -> None:
    """Each month's work takes `delay_s` (so that the workers' runs overlap)."""
    import workers.scheduled as scheduled

    real = scheduled._ingest_month

    def slow(ctx, run, period):
        time.sleep(delay_s)
        return real(ctx, run, period)

    scheduled._ingest_month = slow


def _worker(settings, periods, barrier, results, delay_s):
    """One worker process: every period at the same moment as the others (the barrier)."""
    from workers.scheduled import monthly_ingest

    _slow_months(delay_s)
    with open_context(settings) as ctx:
        for period in periods:
            barrier.wait(timeout=120)
            job = monthly_ingest(ctx, period, wait_s=120)
            results.put((os.getpid(), period, job["state"]))


def _jobs_by_period(settings) -> dict[str, list[str]]:
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            rows = s.execute(select(Job.params, Job.state).where(Job.kind == MONTHLY_INGEST).order_by(Job.id)).all()
    finally:
        db.close()
    out: dict[str, list[str]] = {}
    for params, state in rows:
        out.setdefault(params["period"], []).append(state)
    return out


def test_the_lock_is_an_advisory_lock_on_postgresql_and_a_file_lock_on_sqlite(settings):
    with open_context(settings) as ctx:
        lock = ctx.runner.lock(MONTHLY_INGEST)
        assert isinstance(lock, AdvisoryLock if settings.db_url.startswith("postgresql") else JobLock)
        assert not lock.held()
        with lock.hold():
            assert lock.held()
            with pytest.raises(Exception, match="already running"):
                with lock.hold(wait_s=0.6):  # waits, then gives up
                    pass
        assert not lock.held()


def test_two_workers_run_each_of_twenty_periods_exactly_once(settings):
    open_database(settings).close()  # migrate once, before the workers start
    spawn = mp.get_context("spawn")
    barrier, results = spawn.Barrier(2), spawn.Queue()
    procs = [spawn.Process(target=_worker, args=(settings, PERIODS, barrier, results, 0.3)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    outcomes = [results.get(timeout=5) for _ in range(2 * len(PERIODS))]
    assert sorted(state for _, _, state in outcomes) == ["skipped"] * 20 + ["succeeded"] * 20

    jobs = _jobs_by_period(settings)
    assert sorted(jobs) == sorted(PERIODS)
    for period in PERIODS:  # run once by one worker, skipped (already done) by the other
        assert sorted(jobs[period]) == ["skipped", "succeeded"], (period, jobs[period])


def _hold_a_period(settings, period, started):
    _slow_months(60)
    from workers.scheduled import monthly_ingest

    with open_context(settings) as ctx:
        started.set()
        monthly_ingest(ctx, period, wait_s=0)


def test_a_worker_killed_mid_run_leaves_the_period_to_another(settings):
    open_database(settings).close()
    spawn = mp.get_context("spawn")
    started = spawn.Event()
    first = spawn.Process(target=_hold_a_period, args=(settings, "2031-01", started))
    first.start()
    assert started.wait(timeout=120)
    deadline = time.monotonic() + 60
    while _jobs_by_period(settings).get("2031-01") != ["running"]:
        assert time.monotonic() < deadline, "the first worker never started its run"
        time.sleep(0.1)

    barrier, results = spawn.Barrier(1), spawn.Queue()
    second = spawn.Process(target=_worker, args=(settings, ["2031-01"], barrier, results, 0.0))
    second.start()
    time.sleep(1.5)  # the second worker is waiting for the first one's lock
    assert _jobs_by_period(settings)["2031-01"] == ["running"]
    os.kill(first.pid, signal.SIGKILL)
    first.join(timeout=30)
    second.join(timeout=120)
    assert second.exitcode == 0
    assert results.get(timeout=5)[2] == "succeeded"
    # the dead worker's row is marked interrupted by the one that took the period over
    assert _jobs_by_period(settings)["2031-01"] == ["interrupted", "succeeded"]
