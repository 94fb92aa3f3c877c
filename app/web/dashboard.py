"""The operator's dashboard (`/dashboard`): the index, jobs with live progress, reader and encoder
versions, the schedule, and the evaluations with their reports.

Every action calls the JSON admin API's own route function (same checks, same errors, same jobs);
this module adds a confirmation step before anything starts. The login cookie and the CSRF
tokens are app/web/dashboard_auth.py's, the evaluation pages app/web/dashboard_evaluations.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Form, HTTPException, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import select

from app.api.deps import JobsDep, SessionDep, SettingsDep
from app.api.routes import admin, evaluations, schedule
from app.api.schemas import FinetuneRequest, IngestRequest, ReencodeRequest
from app.web import session as web_session
from app.web.dashboard_auth import SessionCookie, _check_csrf
from app.web.dashboard_evaluations import _runs
from app.web.pages import freshness
from app.web.templating import templates
from app.web.views import ago
from indexer.dates import InvalidDateError
from indexer.shards import is_live_key
from serving.errors import ServiceError
from serving.reader_registry import list_versions
from store.tables import Job
from workers.feed_poller import feed_status

router = APIRouter(prefix="/dashboard", include_in_schema=False)
ACTIVE_STATES = ("queued", "running")


# ---- what the dashboard shows ---------------------------------------------------------------------


def _jobs(session, limit: int = 15) -> dict:
    """The jobs table's context: the newest jobs, and whether one still runs (the poll's pace)."""
    jobs = list(session.scalars(select(Job).order_by(Job.id.desc()).limit(limit)))
    return {"jobs": jobs, "active_states": ACTIVE_STATES, "any_active": any(j.state in ACTIVE_STATES for j in jobs)}


def _overview(request: Request, session, settings) -> dict:
    state = request.app.state.answers.index_state
    state.refresh()
    snap = state.current()
    index = None
    if snap is not None:
        index = {
            "snapshot_id": snap.snapshot_id,
            "vectors": snap.index.ntotal,
            "encoder": snap.manifest.encoder,
            "newest_day": snap.newest_day,
            "months": [
                {
                    "key": e.key,
                    "count": e.count,
                    "first": e.min_day,
                    "last": e.max_day,
                    "encoder": e.encoder or snap.manifest.encoder,
                }
                for e in snap.manifest.shards
                if not is_live_key(e.key)
            ],
        }
    return {
        **_jobs(session),
        "index": index,
        "live": freshness(request, session),
        "feeds": [{**f, "fetched_ago": ago(f["last_fetch_at"])} for f in feed_status(session)],
        "readers": list_versions(session),
        "serving_reader": request.app.state.answers.reader_state.describe(),
        "encoders": admin.list_encoders(request, settings),
        "schedule": schedule.list_schedule(request, session, limit=3),
        "runs": _runs(session, 10),
    }


def _render(
    request: Request,
    cookie: str,
    settings,
    session,
    *,
    errors: dict | None = None,
    values: dict | None = None,
    notice: str | None = None,
    status: int = 200,
) -> HTMLResponse:
    context = _overview(request, session, settings)
    context.update(
        csrf=web_session.csrf_token(settings.admin_token, cookie),
        errors=errors or {},
        values=values or {},
        notice=notice,
    )
    return templates.TemplateResponse(request, "dashboard.html", context, status_code=status)


def _notice(query) -> str | None:
    if (job := query.get("started", "")).isdigit():
        what = query.get("what", "job")
        return f"Started {what if re.fullmatch(r'[a-z -]{1,40}', what) else 'job'}: job {job} (progress below)."
    if version := query.get("activated"):
        return f"Reader version {version} is now active."
    return None


@router.get("", response_class=HTMLResponse)
def dashboard(request: Request, cookie: SessionCookie, settings: SettingsDep, session: SessionDep) -> HTMLResponse:
    return _render(request, cookie, settings, session, notice=_notice(request.query_params))


@router.get("/jobs", response_class=HTMLResponse)
def jobs_fragment(request: Request, cookie: SessionCookie, session: SessionDep) -> HTMLResponse:
    """The jobs table alone: the page's script polls it for live progress."""
    return templates.TemplateResponse(request, "_jobs.html", _jobs(session))


# ---- actions: a confirmation page, then the admin API's own route function ------------------------


@dataclass(frozen=True)
class Action:
    field: str  # the form field it takes
    label: str  # what the confirmation asks
    what: str  # the notice's words
    run: Callable[..., object]  # (value, request, session, jobs, settings) -> the route's response


ACTIONS: dict[str, Action] = {
    "ingest": Action(
        "month",
        "Ingest (or re-ingest) the news of {value}?",
        "ingest",
        lambda v, r, s, j, st: admin.start_ingest(IngestRequest(month=v), r, s, j),
    ),
    "evaluate": Action(
        "quarter",
        "Evaluate the questions of {value} with the serving index?",
        "evaluation",
        lambda v, r, s, j, st: evaluations.start_evaluation(evaluations.EvaluationRequest(quarter=v), j),
    ),
    "finetune": Action(
        "month",
        "Fine-tune the active reader on the news of {value}?",
        "fine-tune",
        lambda v, r, s, j, st: admin.start_finetune(FinetuneRequest(month=v), r, s, j),
    ),
    "activate": Action(
        "version",
        "Make reader version {value} the active one (every server switches to it)?",
        "activate",
        lambda v, r, s, j, st: admin.activate_model(v, r, s, st),
    ),
    "reencode": Action(
        "encoder",
        "Re-encode the whole index with encoder {value}?",
        "re-encode",
        lambda v, r, s, j, st: admin.start_reencode(ReencodeRequest(encoder=v), r, s, j, st),
    ),
    "schedule": Action(
        "job",
        "Run the scheduled job {value} now (for the period just ended)?",
        "scheduled run",
        lambda v, r, s, j, st: schedule.run_now(v, j, None),
    ),
}


REFUSALS = (ValidationError, ServiceError, InvalidDateError, HTTPException)  # what an action may be refused with


def _error_text(exc: Exception) -> tuple[str, int]:
    """A refusal's message and status, as the JSON API would answer it."""
    if isinstance(exc, ValidationError):
        return "; ".join(e["msg"] for e in exc.errors()), 422
    if isinstance(exc, HTTPException):
        return str(exc.detail), exc.status_code
    return str(exc), getattr(exc, "status_code", 422)  # ServiceError, or InvalidDateError (422)


@router.post("/actions/{name}", response_class=HTMLResponse)
def act(
    name: str,
    request: Request,
    cookie: SessionCookie,
    settings: SettingsDep,
    session: SessionDep,
    jobs: JobsDep,
    value: Annotated[str, Form(max_length=200)] = "",
    csrf: Annotated[str, Form(max_length=200)] = "",
    confirmed: Annotated[str, Form(max_length=10)] = "",
) -> Response:
    """First submit: a page that asks for confirmation; the confirmed submit starts the work."""
    action = ACTIONS.get(name)
    if action is None:
        raise HTTPException(404, f"no action {name!r} (known: {', '.join(ACTIONS)})")
    _check_csrf(settings, cookie, csrf)
    value = value.strip()
    if not value:
        return _render(
            request,
            cookie,
            settings,
            session,
            errors={name: f"enter a {action.field}"},
            values={name: value},
            status=422,
        )
    if confirmed != "yes":
        return templates.TemplateResponse(
            request,
            "confirm.html",
            {
                "name": name,
                "value": value,
                "question": action.label.format(value=value),
                "csrf": web_session.csrf_token(settings.admin_token, cookie),
            },
        )
    try:
        result = action.run(value, request, session, jobs, settings)
    except REFUSALS as exc:
        message, status = _error_text(exc)
        return _render(request, cookie, settings, session, errors={name: message}, values={name: value}, status=status)
    if name == "activate":
        return RedirectResponse(f"/dashboard?activated={quote(value)}#readers", status_code=303)
    job_id = getattr(result, "job_id", None) or (result.get("job_id") if isinstance(result, dict) else None)
    query = urlencode({"started": job_id or "", "what": action.what})
    return RedirectResponse(f"/dashboard?{query}#jobs", status_code=303)
