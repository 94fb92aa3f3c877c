"""The one job lifecycle. Every change of a Job row's state happens in this module.

    queued -> running -> succeeded | failed | interrupted        (skipped: a period already done)

The CLI, the admin API and the scheduler start jobs through a `JobRunner`: `run_new` runs one here
and now (the CLI), `submit` runs one on a background thread (the API, 409 while its slot or lock is
busy), `run_period` runs a scheduled period once. The work is a function of a `JobHandle`, which
reports progress (a tqdm bar for people, the row for the API) and counts; work that must commit
its result and its success in one transaction (an ingest's snapshot) calls `handle.succeed_in`.

A job that holds a lock also marks interrupted the "running" rows of its kind left by a process that
died (holding the lock proves nobody else runs them); `recover` does the same at start-up for every
kind whose lock is free.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from serving.errors import ConflictError
from store.base import utcnow
from store.tables import Job
from workers.locks import AdvisoryLock, JobLock
from workers.progress import JobProgress

log = logging.getLogger(__name__)
T = TypeVar("T")


class JobState(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    SKIPPED = "skipped"


FINISHED = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.INTERRUPTED, JobState.SKIPPED})
STALE_ERROR = "the process running this job stopped before it finished; run it again to resume"


def job_dict(job: Job, *, skipped: bool = False) -> dict:
    """A scheduled job's outcome: job_id, kind, period, state, skipped, message, counts, timings, error."""
    return {
        "job_id": job.id,
        "kind": job.kind,
        "period": (job.params or {}).get("period"),
        "state": job.state,
        "skipped": skipped,
        "message": job.message,
        "counts": dict(job.counts or {}),
        "timings": dict(job.timings or {}),
        "error": job.error,
    }


def _merge(old: dict | None, new: Mapping | None) -> dict:
    return {**(old or {}), **(new or {})}


class JobHandle:
    """What running work sees of its job: progress (a `Progress`), counts, timings, its id."""

    def __init__(self, sessions: sessionmaker[Session], job_id: int, progress: JobProgress) -> None:
        self._sessions = sessions
        self.job_id = job_id
        self.progress = progress

    # Progress protocol: the work's stages and steps.
    def stage(self, name: str, total: int) -> None:
        self.progress.stage(name, total)

    def advance(self, n: int = 1) -> None:
        self.progress.advance(n)

    def update(
        self,
        *,
        progress: float | None = None,
        message: str | None = None,
        counts: Mapping | None = None,
        timings: Mapping | None = None,
    ) -> None:
        """Merge counts and timings into the row, set progress and message, beat the heartbeat."""
        with self._sessions() as session, session.begin():
            self.update_in(session, progress=progress, message=message, counts=counts, timings=timings)

    def update_in(
        self,
        session: Session,
        *,
        progress: float | None = None,
        message: str | None = None,
        counts: Mapping | None = None,
        timings: Mapping | None = None,
    ) -> Job:
        """`update` inside the caller's transaction."""
        job = session.get(Job, self.job_id)
        if progress is not None:
            job.progress = progress
        if message is not None:
            job.message = message
        if counts:
            job.counts = _merge(job.counts, counts)
        if timings:
            job.timings = _merge(job.timings, timings)
        job.heartbeat_at = utcnow()
        return job

    def succeed_in(
        self, session: Session, message: str = "done", *, counts: Mapping | None = None, timings: Mapping | None = None
    ) -> None:
        """Mark the job succeeded inside the caller's transaction, with what it committed there."""
        job = self.update_in(session, progress=1.0, message=message, counts=counts, timings=timings)
        job.state, job.error, job.finished_at = JobState.SUCCEEDED, None, utcnow()


Work = Callable[[JobHandle], T]


@dataclass
class _Slot:
    guard: threading.Lock
    thread: threading.Thread | None = None


class JobRunner:
    """Creates, runs and closes job rows. One per process (the entry point's context holds it).

    Args:
        sessions: the database's session factory.
        locks_dir: where named locks live (`lock(name)`): SQA_HOME/work/jobs.
        bar: draw tqdm progress bars (a terminal).
    """

    def __init__(self, sessions: sessionmaker[Session], locks_dir: Path, *, bar: bool = False) -> None:
        self.sessions = sessions
        self.locks_dir = Path(locks_dir)
        self.bar = bar
        self._slots: dict[str, _Slot] = {}
        self._slots_guard = threading.Lock()

    # ---- locks -------------------------------------------------------------------------------------

    def lock(self, name: str) -> JobLock | AdvisoryLock:
        """The named lock, released if its holder dies: on PostgreSQL one holder per database (an
        advisory lock: workers on several machines), else one per SQA_HOME (a file lock)."""
        busy = f"a {name} job is already running; poll GET /admin/jobs and try again when it ends"
        bind = getattr(self.sessions, "kw", {}).get("bind")
        if bind is not None and bind.dialect.name == "postgresql":
            return AdvisoryLock(bind, name, busy)
        return JobLock(self.locks_dir / f"{name}.lock", busy)

    # ---- rows --------------------------------------------------------------------------------------

    def create(self, kind: str, params: Mapping[str, Any]) -> int:
        """A queued job row; returns its id."""
        with self.sessions() as session, session.begin():
            job = Job(
                kind=kind,
                params=dict(params),
                state=JobState.QUEUED,
                progress=0.0,
                message="queued",
                counts={},
                timings={},
            )
            session.add(job)
            session.flush()
            return job.id

    def get(self, job_id: int) -> Job:
        with self.sessions() as session:
            return session.get(Job, job_id)

    def skip(self, kind: str, params: Mapping[str, Any], message: str, counts: Mapping | None = None) -> dict:
        """Record that a period was already done (a row in state skipped) and return it as a dict."""
        with self.sessions() as session, session.begin():
            now = utcnow()
            job = Job(
                kind=kind,
                params=dict(params),
                state=JobState.SKIPPED,
                progress=1.0,
                message=message,
                counts=dict(counts or {}),
                timings={},
                pid=os.getpid(),
                started_at=now,
                finished_at=now,
            )
            session.add(job)
            session.flush()
            log.info("%s %s skipped: %s", kind, dict(params), message)
            return job_dict(job, skipped=True)

    def interrupt_stale(self, kinds: Iterable[str], *, keep: int | None = None, error: str = STALE_ERROR) -> int:
        """Mark interrupted the running rows of these kinds (but `keep`); call it holding their lock."""
        n = 0
        with self.sessions() as session, session.begin():
            query = select(Job).where(Job.kind.in_(list(kinds)), Job.state == JobState.RUNNING)
            for stale in session.scalars(query):
                if stale.id == keep:
                    continue
                stale.state, stale.finished_at, stale.error = JobState.INTERRUPTED, utcnow(), error
                n += 1
        return n

    def recover(self, locks: Mapping[str, JobLock]) -> int:
        """At start-up: running rows of a kind whose lock nobody holds belong to a dead process."""
        free = [kind for kind, lock in locks.items() if not lock.held()]
        return self.interrupt_stale(free) if free else 0

    def _start(self, job_id: int) -> None:
        with self.sessions() as session, session.begin():
            job = session.get(Job, job_id)
            job.state, job.started_at, job.pid, job.message = JobState.RUNNING, utcnow(), os.getpid(), "starting"
            job.error = None

    def _fail(self, job_id: int, exc: BaseException, elapsed: float | None) -> None:
        """failed for an error, interrupted for KeyboardInterrupt, SystemExit and the like."""
        with self.sessions() as session, session.begin():
            job = session.get(Job, job_id)
            if job is None or job.state in FINISHED:
                return
            job.state = JobState.FAILED if isinstance(exc, Exception) else JobState.INTERRUPTED
            job.error = str(exc) or type(exc).__name__
            job.finished_at = utcnow()
            if elapsed is not None:
                job.timings = _merge(job.timings, {"total_s": round(elapsed, 3)})

    def _succeed(self, job_id: int, message: str, result_key: str | None, result: Any, elapsed: float) -> None:
        with self.sessions() as session, session.begin():
            job = session.get(Job, job_id)
            if job.state not in FINISHED:
                job.state, job.progress, job.error, job.finished_at = JobState.SUCCEEDED, 1.0, None, utcnow()
                job.message = message
            if result_key is not None:
                job.counts = _merge(job.counts, {result_key: result})
            job.timings = _merge(job.timings, {"total_s": round(elapsed, 3)})

    # ---- running -----------------------------------------------------------------------------------

    def run(
        self,
        job_id: int,
        work: Work[T],
        *,
        lock: JobLock | None = None,
        weights: Mapping[str, float] | None = None,
        bar: bool | None = None,
        result_key: str | None = None,
        message: Callable[[T], str] | str = "done",
    ) -> T:
        """Run `work(handle)` for a queued job to the end and return what it returns.

        With `lock`, the job holds it while it runs (ConflictError, and a failed row, when another
        process does) and first marks interrupted the running rows its kind left behind. A failure is
        recorded on the row and raised again. `result_key` keeps the result in the row's counts.
        """
        progress = JobProgress(self.sessions, job_id, bar=self.bar if bar is None else bar, weights=dict(weights or {}))
        handle = JobHandle(self.sessions, job_id, progress)
        t0 = time.perf_counter()
        try:
            if lock is None:
                self._start(job_id)
                result = work(handle)
            else:
                with lock.hold():
                    kind = self.get(job_id).kind
                    self.interrupt_stale([kind], keep=job_id)
                    self._start(job_id)
                    result = work(handle)
        except BaseException as exc:
            self._fail(job_id, exc, time.perf_counter() - t0)
            log.error("job %d failed: %s", job_id, exc)
            raise
        finally:
            progress.close()
        self._succeed(
            job_id, message(result) if callable(message) else message, result_key, result, time.perf_counter() - t0
        )
        return result

    def run_new(self, kind: str, params: Mapping[str, Any], work: Work[T], **options: Any) -> T:
        """Create the row and run it here and now (the CLI's way, and the tests')."""
        return self.run(self.create(kind, params), work, **options)

    def run_period(
        self,
        kind: str,
        period: str,
        work: Work[str],
        *,
        lock: JobLock | AdvisoryLock,
        done: Callable[[Session], tuple[str, dict] | None] | None = None,
        wait_s: float = 0.0,
    ) -> dict:
        """A scheduled job's run for one period, once: a period a succeeded job (or `done`) already
        covers is recorded as skipped. Returns the job as a dict (`job_dict`).

        With several workers, all run it at its time: the first holds `lock`, the others wait for it
        up to `wait_s` seconds, then find the period done and record a skip. If the holder died
        (its lock is released with it), the next one marks its row interrupted and runs the period."""
        with lock.hold(wait_s):
            self.interrupt_stale([kind])
            with self.sessions() as session:
                done_by = next(
                    (
                        job_id
                        for job_id, params in session.execute(
                            select(Job.id, Job.params)
                            .where(Job.kind == kind, Job.state == JobState.SUCCEEDED)
                            .order_by(Job.id.desc())
                        )
                        if (params or {}).get("period") == period
                    ),
                    None,
                )
                outcome = (
                    (f"{period} already done by job {done_by}; nothing to do", {"done_by_job": done_by})
                    if done_by is not None
                    else done(session)
                    if done
                    else None
                )
            if outcome is not None:
                return self.skip(kind, {"period": period}, *outcome)
            job_id = self.create(kind, {"period": period})
            log.info("%s %s started (job %d)", kind, period, job_id)
            try:
                self.run(job_id, work, message=lambda m: m)
            finally:
                with self.sessions() as session:
                    result = job_dict(session.get(Job, job_id))
            log.info("%s %s %s (job %d): %s", kind, period, result["state"], job_id, result["message"])
            return result

    # ---- in the background (the API) ---------------------------------------------------------------

    def _slot(self, name: str) -> _Slot:
        with self._slots_guard:
            return self._slots.setdefault(name, _Slot(threading.Lock()))

    def spawn(
        self,
        slot: str,
        fn: Callable[[], Any],
        *,
        busy: Callable[[], bool] = lambda: False,
        conflict: str = "a job of this kind is already running; poll GET /admin/jobs and try again when it ends",
        create: Callable[[], int] | None = None,
    ) -> int | None:
        """Run `fn()` on a daemon thread, one at a time per slot in this process; ConflictError (409)
        while the slot's thread lives or `busy()` says another process holds the work's lock.
        `create` makes the job row under the slot's guard (its id is returned and passed to nobody)."""
        s = self._slot(slot)
        with s.guard:
            if (s.thread is not None and s.thread.is_alive()) or busy():
                raise ConflictError(conflict)
            job_id = create() if create is not None else None

            def target() -> None:
                try:
                    fn()
                except Exception:  # recorded on the job row; the thread has nobody else to tell
                    log.exception("background work in slot %s failed", slot)

            s.thread = threading.Thread(target=target, name=f"{slot}-{job_id or 'run'}", daemon=True)
            s.thread.start()
        return job_id

    def submit(
        self,
        kind: str,
        params: Mapping[str, Any],
        work: Work[Any],
        *,
        slot: str,
        lock: JobLock | None = None,
        conflict: str | None = None,
        after: Callable[[], None] | None = None,
        **options: Any,
    ) -> int:
        """Create a queued job and run it on a background thread (see `spawn`); `after()` runs once
        it succeeded (the server serves the new snapshot or reader). Returns the job id."""
        ids: list[int] = []

        def fn() -> None:
            self.run(ids[0], work, lock=lock, **options)
            if after is not None:
                try:
                    after()
                except Exception:
                    log.exception("after job %d succeeded, its follow-up failed", ids[0])

        def create() -> int:
            ids.append(self.create(kind, params))
            return ids[0]

        return self.spawn(
            slot,
            fn,
            busy=lock.held if lock is not None else (lambda: False),
            conflict=conflict
            or (lock.busy if lock is not None else f"a {kind} job is already running; poll GET /admin/jobs"),
            create=create,
        )

    def wait_all(self, timeout: float | None = None) -> list[str]:
        """Wait for every slot's background thread, `timeout` seconds in all (tests, shutdown);
        returns the names of the threads still running."""
        with self._slots_guard:
            slots = list(self._slots.values())
        deadline = None if timeout is None else time.monotonic() + timeout
        for slot in slots:
            if slot.thread is not None:
                slot.thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [s.thread.name for s in slots if s.thread is not None and s.thread.is_alive()]

    def wait(self, slot: str, timeout: float | None = None) -> None:
        """Wait for the slot's background thread (tests, shutdown)."""
        thread = self._slot(slot).thread
        if thread is not None:
            thread.join(timeout)
