"""The scheduler process (`sqa worker`): APScheduler 3 with its job store in the project's database.

Jobs are stored by textual reference ("app.bootstrap:scheduled_monthly_ingest": the entry-point
function that builds the job's context from the settings, then runs workers.scheduled's job) so
the job store can persist them, with stable ids. Defaults: coalesce (several missed runs run once), one instance
at a time, and a misfire grace of SQA_MISFIRE_GRACE_S (APScheduler's default of 1 s would silently drop a run
missed while the worker restarted).

Never started inside the web server: several web workers would each start one. The API only reads
the job store (`scheduled_jobs`) and runs job functions directly (`trigger_now`).
"""

from __future__ import annotations

import datetime as dt
import logging
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_MISSED, JobExecutionEvent
from apscheduler.job import Job as ScheduledJob
from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import STATE_STOPPED, BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from sqlalchemy import inspect
from sqlalchemy.engine import make_url

from serving.errors import InvalidInputError, NotFoundError
from workers import scheduled as jobs
from workers.config import SchedulerConfig

log = logging.getLogger(__name__)
utc = dt.UTC


@dataclass(frozen=True)
class JobSpec:
    id: str  # also the Job.kind its runs record
    ref: str  # textual reference: what the job store persists
    name: str
    cron: str
    setting: str  # the environment variable the cron comes from


def job_specs(cfg: SchedulerConfig) -> list[JobSpec]:
    return [
        JobSpec(
            jobs.MONTHLY_INGEST,
            "app.bootstrap:scheduled_monthly_ingest",
            "monthly ingest of the month just ended",
            cfg.ingest_cron,
            "SQA_INGEST_CRON",
        ),
        JobSpec(
            jobs.QUARTERLY_EVALUATION,
            "app.bootstrap:scheduled_quarterly_evaluation",
            "quarterly evaluation of the quarter just ended",
            cfg.eval_cron,
            "SQA_EVAL_CRON",
        ),
        *(
            [
                JobSpec(
                    jobs.WEEKLY_ADAPTATION,
                    "app.bootstrap:scheduled_weekly_adaptation",
                    "weekly adaptation of the re-ranker and the reader to the last days' news",
                    cfg.adapt_cron,
                    "SQA_ADAPT_CRON",
                )
            ]
            if cfg.adapt_cron.strip()
            else []
        ),
    ]


def _trigger(spec: JobSpec) -> CronTrigger:
    try:
        return CronTrigger.from_crontab(spec.cron, timezone=utc)
    except ValueError as exc:
        raise InvalidInputError(
            f"{spec.setting}={spec.cron!r} is not a cron expression "
            f"(minute hour day month weekday, e.g. '0 2 1 * *'): {exc}"
        ) from None


def _job_store(cfg: SchedulerConfig) -> SQLAlchemyJobStore:
    url = cfg.db_url
    # SQLite: wait for the jobs' own writes instead of failing after sqlite3's default 5 s.
    options = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else {"pool_pre_ping": True}
    return SQLAlchemyJobStore(url=url, engine_options=options)


class WorkerScheduler(BackgroundScheduler):
    """A BackgroundScheduler that processes no jobs once shut down.

    APScheduler 3's loop processes due jobs once more after `shutdown()` (it wakes, then checks
    the state); the executors are gone by then, so a run falling due at that moment fails to
    submit and its next run time moves on: the run is lost. Stopping a paused scheduler that holds
    a due job loses it every time.
    """

    def _process_jobs(self):
        if self.state == STATE_STOPPED:
            return None
        return super()._process_jobs()


def _read_store(cfg: SchedulerConfig, read: Callable[[SQLAlchemyJobStore], object], default: object) -> object:
    """Read the job store without a running scheduler (nothing can run); `default` if it has no table."""
    url = make_url(cfg.db_url)
    if (
        url.get_backend_name() == "sqlite"
        and url.database not in (None, "", ":memory:")
        and not Path(url.database).exists()
    ):
        return default  # no worker and no server has run yet; don't create the file
    store = _job_store(cfg)
    try:
        if not inspect(store.engine).has_table(store.jobs_t.name):
            return default
        store.start(BackgroundScheduler(timezone=utc), "default")  # never started: only restores jobs
        return read(store)
    finally:
        store.shutdown()


def _stored(cfg: SchedulerConfig, ids: list[str]) -> dict[str, ScheduledJob]:
    def read(store: SQLAlchemyJobStore) -> dict[str, ScheduledJob]:
        out = {}
        for job_id in ids:
            try:
                job = store.lookup_job(job_id)
            except Exception:  # unreadable (an APScheduler upgrade): replaced below
                log.warning("stored job %s could not be restored; it is replaced", job_id, exc_info=True)
                continue
            if job is not None:
                out[job_id] = job
        return out

    return _read_store(cfg, read, {})  # type: ignore[return-value]


def _log_event(event: JobExecutionEvent) -> None:
    if event.code == EVENT_JOB_MISSED:
        log.warning(
            "job %s: the run due at %s was missed by more than SQA_MISFIRE_GRACE_S; run it by hand with "
            "POST /admin/schedule/%s/run",
            event.job_id,
            event.scheduled_run_time,
            event.job_id,
        )
    elif event.code == EVENT_JOB_ERROR:
        log.error("job %s (due %s) failed: %s", event.job_id, event.scheduled_run_time, event.exception)


def build_scheduler(cfg: SchedulerConfig, *, scheduler_cls: type[BaseScheduler] = BlockingScheduler) -> BaseScheduler:
    """A scheduler (not started) holding the monthly ingest and the quarterly evaluation.

    A job already in the store with the same trigger keeps its stored next run time (also when its
    function moved, as it did from workers.jobs to app.bootstrap):
    `replace_existing=True` alone would recompute it from now, and so silently drop a run missed
    while the worker was down, whatever the misfire grace. A changed cron replaces the job. A job
    paused in the store stays paused.
    """
    scheduler = scheduler_cls(
        jobstores={"default": _job_store(cfg)},
        timezone=utc,
        job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": cfg.misfire_grace_s},
    )
    specs = job_specs(cfg)
    triggers = {spec.id: _trigger(spec) for spec in specs}  # bad crons fail before anything is stored
    stored = _stored(cfg, [spec.id for spec in specs])
    for spec in specs:
        trigger, old = triggers[spec.id], stored.get(spec.id)
        keep = {}
        if old is not None and repr(old.trigger) == repr(trigger):
            keep["next_run_time"] = old.next_run_time
        scheduler.add_job(spec.ref, trigger, id=spec.id, name=spec.name, replace_existing=True, **keep)
    scheduler.add_listener(_log_event, EVENT_JOB_MISSED | EVENT_JOB_ERROR)
    return scheduler


def _iso(when: dt.datetime | None) -> str | None:
    return when.astimezone(utc).isoformat() if when is not None else None


def scheduled_jobs(cfg: SchedulerConfig) -> list[dict]:
    """Every job in the store: id, name, trigger, next_run_time (ISO UTC; None when paused).

    Reads the job store alone; no scheduler is started, so nothing runs. Empty until a worker has
    started once.
    """

    def read(store: SQLAlchemyJobStore) -> list[dict]:
        return [
            {"id": j.id, "name": j.name, "trigger": str(j.trigger), "next_run_time": _iso(j.next_run_time)}
            for j in store.get_all_jobs()
        ]

    return _read_store(cfg, read, [])  # type: ignore[return-value]


def job_function(job_id: str) -> Callable[..., dict]:
    fn = jobs.JOBS.get(job_id)
    if fn is None:
        raise NotFoundError(f"no scheduled job {job_id!r}; valid ids: {', '.join(jobs.JOBS)}")
    return fn


def trigger_now(ctx, job_id: str, period: str | None = None) -> dict:
    """Run a scheduled job now in `ctx` (a JobContext), in the calling thread (default period: the one
    just ended)."""
    return job_function(job_id)(ctx, period)


def run_worker(cfg: SchedulerConfig, services: list | None = None) -> None:
    """Run the scheduler until SIGTERM or SIGINT.

    The first signal stops scheduling and waits for a running job to finish; a second one ends the
    process at once (the jobs are safe to kill: ingest resumes from its checkpoints, and the job
    row is marked interrupted and runs again on the next trigger). A background scheduler with the
    main thread waiting keeps the signal handler trivial: it only sets an event.
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    scheduler = build_scheduler(cfg, scheduler_cls=WorkerScheduler)
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info(
            "%s received: stopping once the running job (if any) ends; send it again to stop at once",
            signal.Signals(signum).name,
        )
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    services = list(services or [])  # loops beside the scheduler (live publisher, feeds, inbox): run() / stop()
    threads = [threading.Thread(target=svc.run, name=type(svc).__name__, daemon=True) for svc in services]
    try:
        scheduler.start()
        for thread in threads:
            thread.start()
            log.info("started %s", thread.name)
        for job in scheduler.get_jobs():
            log.info("scheduled %s (%s): next run %s", job.id, job.trigger, _iso(job.next_run_time) or "paused")
        log.info("worker running (database %s); stop with SIGTERM or Ctrl-C", cfg.db_url.split("@")[-1])
        stop.wait()
    finally:
        for svc in services:
            svc.stop()
        for thread in threads:
            if thread.is_alive():
                thread.join(timeout=60)  # a publish in progress finishes (or is safe to kill)
        if scheduler.running:
            scheduler.shutdown(wait=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    log.info("worker stopped")
