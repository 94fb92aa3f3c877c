from __future__ import annotations

import base64
import logging
import mimetypes
import re
from pathlib import Path

from fastapi import APIRouter, status
from fastapi.responses import HTMLResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select

from app.api.deps import AdminDep, JobsDep, RowId, SessionDep
from app.api.schemas import ADMIN_ERRORS, json_error_responses
from evaluation.temporal import quarter_bounds
from serving.errors import InvalidInputError, NotFoundError
from store.tables import EvalResult, EvalRun
from workers.evaluate import evaluate_current

log = logging.getLogger(__name__)
router = APIRouter(prefix="/admin/evaluations", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


class EvaluationRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    quarter: str = Field(description="YYYYQn: evaluate this quarter's questions with the serving index.")


def _public(run: EvalRun, n_results: int) -> dict:
    return {
        "id": run.id,
        "kind": run.kind,
        "state": run.state,
        "params": run.params,
        "error": run.error,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "results": n_results,
        "report_url": f"/admin/evaluations/{run.id}/report" if run.report_dir else None,
    }


def _run(session, run_id: int) -> EvalRun:
    run = session.get(EvalRun, run_id)
    if run is None:
        raise NotFoundError(f"no evaluation run with id {run_id}")
    return run


@router.get("")
def list_evaluations(session: SessionDep, limit: int = 50) -> list[dict]:
    runs = session.scalars(select(EvalRun).order_by(EvalRun.id.desc()).limit(max(1, min(limit, 500)))).all()
    counts = dict(
        session.execute(
            select(EvalResult.run_id, func.count())
            .where(EvalResult.run_id.in_([r.id for r in runs]))
            .group_by(EvalResult.run_id)
        ).all()
    )
    return [_public(r, counts.get(r.id, 0)) for r in runs]


@router.get("/{run_id}")
def get_evaluation(run_id: RowId, session: SessionDep) -> dict:
    run = _run(session, run_id)
    n = session.scalar(select(func.count()).select_from(EvalResult).where(EvalResult.run_id == run_id))
    return {**_public(run, n), "summary": run.summary}


def report_folder(session, run_id: int) -> tuple[EvalRun, Path]:
    """The run and the folder of its written report (404 for an unknown run or a report not written yet)."""
    run = _run(session, run_id)
    if not run.report_dir or not (Path(run.report_dir) / "report.html").exists():
        raise NotFoundError(f"evaluation run {run_id} has no report yet (state: {run.state})")
    return run, Path(run.report_dir)


@router.get("/{run_id}/report", response_class=HTMLResponse, responses=json_error_responses(ADMIN_ERRORS))
def get_report(run_id: RowId, session: SessionDep) -> HTMLResponse:
    """The run's HTML report, with its plots inlined (the admin header cannot follow <img> links)."""
    _, folder = report_folder(session, run_id)
    html = (folder / "report.html").read_text()

    def inline(match: re.Match) -> str:
        name = match.group(1)
        path = folder / name
        if "/" in name or not path.is_file():
            return match.group(0)
        mime = mimetypes.guess_type(name)[0] or "application/octet-stream"
        return f'src="data:{mime};base64,{base64.b64encode(path.read_bytes()).decode()}"'

    return HTMLResponse(re.sub(r'src="([^"]+\.png)"', inline, html))


@router.post("", status_code=status.HTTP_202_ACCEPTED)
def start_evaluation(body: EvaluationRequest, jobs: JobsDep) -> dict:
    """Evaluate a quarter in the background with the serving index; poll GET /admin/evaluations
    (or the job)."""
    try:
        quarter_bounds(body.quarter)
    except ValueError as exc:
        raise InvalidInputError(str(exc)) from None
    cfg = jobs.evaluation
    job_id = jobs.runner.submit(
        "evaluation",
        {"quarter": body.quarter, "max_questions": cfg.max_questions},
        lambda job: evaluate_current(
            jobs.sessions,
            jobs.load_answer_service(),
            body.quarter,
            cfg,
            jobs.reports_dir,
            job_id=job.job_id,
            progress=job,
        ),
        slot=f"evaluate-{body.quarter}",
        result_key="eval_run",
        conflict=f"an evaluation of {body.quarter} is already running; poll GET /admin/evaluations",
    )
    return {"quarter": body.quarter, "state": "started", "status_url": "/admin/evaluations", "job_id": job_id}
