from __future__ import annotations

import logging
import threading

from fastapi import APIRouter, Request, status
from sqlalchemy import select

from app.api.deps import AdminDep, DatabaseDep, SessionDep
from app.api.schemas import IngestRequest, JobPublic, JobStarted, SnapshotPublic
from app.db.queries import create_job
from app.db.tables import Job
from app.services.errors import ConflictError, NotFoundError
from workers.ingest import STAGE_WEIGHTS, check_month_request, ingest_lock_held, run_ingest_job
from workers.progress import JobProgress

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep])


def _public(job: Job) -> JobPublic:
    return JobPublic.model_validate(job, from_attributes=True)


@router.post("/ingest", response_model=JobStarted, status_code=status.HTTP_202_ACCEPTED)
def start_ingest(body: IngestRequest, request: Request, session: SessionDep, db: DatabaseDep) -> JobStarted:
    """Ingest (or re-ingest) one month in the background; poll the returned job."""
    app = request.app
    encoder = app.state.answers.retriever.encoder
    cfg = app.state.ingest_config

    def work(job_id: int) -> None:
        try:
            run_ingest_job(db.sessions, encoder, cfg, job_id, JobProgress(db.sessions, job_id, weights=STAGE_WEIGHTS))
            app.state.answers.index_state.refresh()  # serve the new snapshot now
        except Exception:
            log.exception("ingest job %d failed", job_id)

    plan = check_month_request(session, cfg.index_dir, encoder, body.month)  # 422 before any job exists
    with app.state.ingest_guard:
        thread = app.state.ingest_thread
        if (thread is not None and thread.is_alive()) or ingest_lock_held(cfg.index_dir):
            raise ConflictError("an ingest is already running; poll GET /admin/jobs and try again when it ends")
        job = create_job(session, "ingest", {"month": plan.key})
        session.commit()
        job_id = job.id
        app.state.ingest_thread = threading.Thread(target=lambda: work(job_id), name=f"ingest-{job_id}",
                                                   daemon=True)
        app.state.ingest_thread.start()
    return JobStarted(job_id=job_id, state="queued", status_url=f"/admin/jobs/{job_id}")


@router.get("/jobs", response_model=list[JobPublic])
def list_jobs(session: SessionDep, limit: int = 50) -> list[JobPublic]:
    jobs = session.scalars(select(Job).order_by(Job.id.desc()).limit(max(1, min(limit, 500))))
    return [_public(j) for j in jobs]


@router.get("/jobs/{job_id}", response_model=JobPublic)
def get_job(job_id: int, session: SessionDep) -> JobPublic:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFoundError(f"no job with id {job_id}")
    return _public(job)


@router.get("/index", response_model=SnapshotPublic)
def get_index(request: Request) -> SnapshotPublic:
    snap = request.app.state.answers.index_state.current()
    if snap is None:
        raise NotFoundError("no index snapshot is loaded yet")
    return SnapshotPublic(snapshot_id=snap.snapshot_id, vectors=snap.index.ntotal,
                          shards=[e.key for e in snap.manifest.shards], encoder=snap.manifest.encoder,
                          newest_day=snap.newest_day)
