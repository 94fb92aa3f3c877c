"""Admin view of the scheduler: what is scheduled, what ran, and run a job now.

The scheduler runs in its own process (`sqa worker`); these routes only read its job store and the
jobs table, and run a job function in a background thread of the API process (the job runner's).
"""

from __future__ import annotations

import datetime as dt
import logging

from fastapi import APIRouter, Query, Request, status
from pydantic import BaseModel
from sqlalchemy import select

from app.api.deps import AdminDep, JobsDep, SessionDep
from app.api.schemas import ADMIN_ERRORS
from store.tables import Job
from workers.scheduled import normalize_period
from workers.scheduler import job_function, job_specs, scheduled_jobs, trigger_now

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin/schedule", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


# Response bodies of these routes only (kept here rather than in app/api/schemas.py).
class JobRunPublic(BaseModel):
    job_id: int
    state: str
    period: str | None
    message: str
    error: str | None
    created_at: dt.datetime
    started_at: dt.datetime | None
    finished_at: dt.datetime | None


class ScheduledJobPublic(BaseModel):
    id: str
    name: str
    cron: str  # as configured (UTC)
    scheduled: bool  # false until a worker (`sqa worker`) has stored the job
    trigger: str | None
    next_run_time: dt.datetime | None  # None: not scheduled yet, or paused
    history: list[JobRunPublic]  # newest first


class ScheduleRunStarted(BaseModel):
    kind: str
    period: str | None  # None: the period just ended
    state: str
    status_url: str
    hint: str


@router.get("", response_model=list[ScheduledJobPublic])
def list_schedule(
    request: Request,
    session: SessionDep,
    limit: int = Query(10, ge=1, le=100, description="recent runs listed per job"),
) -> list[ScheduledJobPublic]:
    """The scheduled jobs, their next run (UTC) and the recent runs of each."""
    cfg = request.app.state.scheduler  # the SchedulerConfig of the settings
    stored = {j["id"]: j for j in scheduled_jobs(cfg)}
    out = []
    for spec in job_specs(cfg):
        rows = session.scalars(select(Job).where(Job.kind == spec.id).order_by(Job.id.desc()).limit(limit))
        history = [
            JobRunPublic(
                job_id=j.id,
                state=j.state,
                period=(j.params or {}).get("period"),
                message=j.message,
                error=j.error,
                created_at=j.created_at,
                started_at=j.started_at,
                finished_at=j.finished_at,
            )
            for j in rows
        ]
        job = stored.get(spec.id)
        out.append(
            ScheduledJobPublic(
                id=spec.id,
                name=spec.name,
                cron=spec.cron,
                scheduled=job is not None,
                trigger=job["trigger"] if job else None,
                next_run_time=job["next_run_time"] if job else None,
                history=history,
            )
        )
    return out


@router.post("/{job_id}/run", response_model=ScheduleRunStarted, status_code=status.HTTP_202_ACCEPTED)
def run_now(
    job_id: str,
    jobs: JobsDep,
    period: str | None = Query(
        None,
        description="YYYY-MM (monthly-ingest), YYYYQN (quarterly-evaluation) or YYYY-MM-DD (weekly-adaptation: "
        "it learns what is dated before that day); default: the period just ended (the adaptation: today)",
    ),
) -> ScheduleRunStarted:
    """Run a scheduled job now, in the background. A period already done is skipped (and recorded)."""
    job_function(job_id)  # 404 naming the valid ids
    period = normalize_period(job_id, period) if period else None  # 422 before anything starts
    runner = jobs.runner
    runner.spawn(
        f"schedule-{job_id}",
        lambda: trigger_now(jobs, job_id, period),
        busy=runner.lock(job_id).held,
        conflict=f"a {job_id} job is already running; poll GET /admin/jobs and try again when it ends",
    )
    return ScheduleRunStarted(
        kind=job_id,
        period=period,
        state="started",
        status_url="/admin/jobs",
        hint=f"poll GET /admin/jobs (kind {job_id}) or GET /admin/schedule for its state",
    )
