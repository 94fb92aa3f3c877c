"""The operator's dashboard (`/dashboard`): the index, jobs with live progress, reader and encoder
versions, the schedule, and the evaluations with their reports.

Every action calls the JSON admin API's own route function (same checks, same errors, same jobs);
this module adds the login cookie, CSRF tokens and a confirmation step before anything starts.
"""

from __future__ import annotations

import io
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, Form, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from pydantic import ValidationError
from sqlalchemy import case, func, select

from app.api.deps import JobsDep, RowId, SessionDep, SettingsDep
from app.api.routes import admin, evaluations, schedule
from app.api.schemas import FinetuneRequest, IngestRequest, ReencodeRequest
from app.web import session as web_session
from app.web.pages import freshness
from app.web.templating import templates
from app.web.views import ago
from indexer.dates import InvalidDateError
from indexer.shards import is_live_key
from serving.errors import NotFoundError, ServiceError
from serving.reader_registry import list_versions
from store.tables import EvalResult, EvalRun, Job
from workers.feed_poller import feed_status

router = APIRouter(prefix="/dashboard", include_in_schema=False)
ACTIVE_STATES = ("queued", "running")


class LoginRequired(Exception):
    """No valid session cookie: app/main.py answers with a redirect to the login page."""

    def __init__(self, next_url: str) -> None:
        self.next_url = next_url


def current_session(request: Request, settings: SettingsDep) -> str:
    """The request's valid session cookie, or LoginRequired."""
    value = request.cookies.get(web_session.COOKIE)
    if not web_session.valid_session(settings.admin_token, value):
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise LoginRequired(target if request.method == "GET" else "/dashboard")
    return value


SessionCookie = Annotated[str, Depends(current_session)]


def _safe_next(url: str | None) -> str:
    """Only a path of this site (never //host or a scheme): no open redirect through the login."""
    return url if url and url.startswith("/dashboard") and not url.startswith("//") else "/dashboard"


def _client(request: Request) -> str:
    return request.client.host if request.client else "unknown"


# ---- login ----------------------------------------------------------------------------------------


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, settings: SettingsDep, next: str = "/dashboard") -> HTMLResponse:
    error = None if settings.admin_token else "admin pages are disabled: set SQA_ADMIN_TOKEN on the server"
    return templates.TemplateResponse(
        request, "login.html", {"next": _safe_next(next), "error": error}, status_code=403 if error else 200
    )


@router.post("/login", response_class=HTMLResponse)
def login(
    request: Request,
    settings: SettingsDep,
    token: Annotated[str, Form(max_length=1000)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/dashboard",
) -> Response:
    """The admin token, checked in constant time; wrong ones count towards the admin lockout."""
    target = _safe_next(next)

    def again(message: str, status: int, headers: dict | None = None) -> HTMLResponse:
        return templates.TemplateResponse(
            request, "login.html", {"next": target, "error": message}, status_code=status, headers=headers
        )

    if not settings.admin_token:
        return again("admin pages are disabled: set SQA_ADMIN_TOKEN on the server", 403)
    guard = getattr(request.app.state, "admin_guard", None)
    if guard is not None and (wait := guard.blocked_for(_client(request))) is not None:
        return again(
            f"too many failed logins from this client; try again in {wait:.0f} s",
            429,
            {"Retry-After": str(int(wait) + 1)},
        )
    if not token or not secrets.compare_digest(token.encode(), settings.admin_token.encode()):
        if guard is not None:
            guard.failed(_client(request))
        return again("that is not the admin token (SQA_ADMIN_TOKEN)" if token else "enter the admin token", 401)
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https" or settings.env == "production"
    response.set_cookie(
        web_session.COOKIE,
        web_session.new_session(settings.admin_token),
        max_age=web_session.SESSION_MAX_AGE_S,
        httponly=True,
        samesite="strict",
        secure=secure,
        path="/dashboard",
    )
    return response


@router.post("/logout")
def logout(
    request: Request, settings: SettingsDep, cookie: SessionCookie, csrf: Annotated[str, Form(max_length=200)] = ""
) -> Response:
    _check_csrf(settings, cookie, csrf)
    response = RedirectResponse("/dashboard/login", status_code=303)
    response.delete_cookie(web_session.COOKIE, path="/dashboard")
    return response


def _check_csrf(settings, cookie: str, token: str) -> None:
    if not web_session.valid_csrf(settings.admin_token, cookie, token):
        raise HTTPException(403, "the form's security token is missing or stale: reload the page and try again")


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


# ---- evaluations --------------------------------------------------------------------------------


def _runs(session, limit: int = 50) -> list[dict]:
    """The newest runs, newest first, with their scores (`_scored`)."""
    return _scored(session, list(session.scalars(select(EvalRun).order_by(EvalRun.id.desc()).limit(limit))))


def _scored(session, runs: list[EvalRun]) -> list[dict]:
    """Each run with its mean scores over every answered row and per subset (one grouped query). A
    run's pooled mean of a score weighs each subset by its rows that have that score (a row evaluated
    before `grounded` was recorded has none), so a subset of unscored rows does not dilute it."""
    ids = [r.id for r in runs]
    scores: dict[int, dict] = {i: {} for i in ids}
    scored: dict[int, dict] = {i: {} for i in ids}  # run -> subset -> rows with each score
    keys = ("em", "f1", "recall", "grounded")
    if ids:
        grounded = case((EvalResult.grounded.is_(True), 1.0), (EvalResult.grounded.is_(False), 0.0))  # else NULL
        columns = (EvalResult.em, EvalResult.f1, EvalResult.recall, grounded)
        rows = session.execute(
            select(
                EvalResult.run_id,
                EvalResult.subset,
                func.count(),
                *(func.avg(c) for c in columns),
                *(func.count(c) for c in columns),
            )
            .where(EvalResult.run_id.in_(ids))
            .group_by(EvalResult.run_id, EvalResult.subset)
        )
        for run_id, subset, n, *values in rows:
            means, counts = values[: len(keys)], values[len(keys) :]
            scores[run_id][subset] = {"n": n, **dict(zip(keys, means))}
            scored[run_id][subset] = dict(zip(keys, counts))
    out = []
    for r in runs:
        parts, counts = scores[r.id], scored[r.id]
        n = sum(p["n"] for p in parts.values())

        def pooled(key):  # called within this iteration only
            vals = [(p[key], counts[s][key]) for s, p in parts.items() if p[key] is not None]  # noqa: B023
            return sum(v * c for v, c in vals) / sum(c for _, c in vals) if vals else None

        out.append(
            {
                "run": r,
                "n": n,
                **{k: pooled(k) for k in keys},
                "subsets": parts,
                "label": (r.params or {}).get("quarter")
                or f"{(r.params or {}).get('first', '')}..{(r.params or {}).get('last', '')}".strip("."),
            }
        )
    return out


@router.get("/evaluations", response_class=HTMLResponse)
def evaluations_page(
    request: Request, cookie: SessionCookie, settings: SettingsDep, session: SessionDep
) -> HTMLResponse:
    """Every run with its scores, and the trend across runs."""
    runs = _runs(session, 200)
    return templates.TemplateResponse(
        request,
        "evaluations.html",
        {
            "runs": runs,
            "has_scores": any(r["f1"] is not None or r["recall"] is not None for r in runs),
            "csrf": web_session.csrf_token(settings.admin_token, cookie),
        },
    )


@router.get("/evaluations/trend.png")
def trend_plot(cookie: SessionCookie, session: SessionDep) -> Response:
    """F1, EM and recall of the succeeded runs in the order they ran."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = [r for r in reversed(_runs(session, 200)) if r["run"].state == "succeeded"]
    fig = Figure(figsize=(7, 3.4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    x = list(range(len(runs)))
    for key, label in (("f1", "F1"), ("em", "EM"), ("recall", "recall@k")):
        y = [r[key] if r[key] is not None else float("nan") for r in runs]
        ax.plot(x, y, marker="o", label=label)
    ax.set_xticks(x, [f"#{r['run'].id} {r['label']}" for r in runs], rotation=30, ha="right", fontsize=8)
    ax.set(ylim=(0, 1.05), ylabel="mean over answered questions", title="Evaluation runs, oldest first")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return Response(buf.getvalue(), media_type="image/png", headers={"Cache-Control": "no-store"})


@router.get("/evaluations/{run_id}", response_class=HTMLResponse)
def evaluation_page(run_id: RowId, request: Request, cookie: SessionCookie, session: SessionDep) -> HTMLResponse:
    """One run's report (written by evaluation/report.py) inside the dashboard, its plots linked here."""
    from markupsafe import Markup

    run, folder = evaluations.report_folder(session, run_id)
    html = (folder / "report.html").read_text(encoding="utf-8")
    body = html.split("<body>", 1)[-1].rsplit("</body>", 1)[0]
    body = re.sub(r'src="([\w.-]+\.png)"', lambda m: f'src="/dashboard/evaluations/{run_id}/files/{m.group(1)}"', body)
    score = _scored(session, [run])[0]
    # The report is this project's own output, every value in it escaped when it was written.
    return templates.TemplateResponse(request, "evaluation.html", {"run": run, "score": score, "body": Markup(body)})


@router.get("/evaluations/{run_id}/files/{name}")
def evaluation_file(run_id: RowId, name: str, cookie: SessionCookie, session: SessionDep) -> Response:
    if not re.fullmatch(r"[\w.-]+\.png", name) or name.startswith("."):
        raise NotFoundError(f"no plot {name!r}")
    _, folder = evaluations.report_folder(session, run_id)
    path = folder / name
    if not path.is_file():
        raise NotFoundError(f"evaluation run {run_id} has no plot {name!r}")
    return FileResponse(path, media_type="image/png")
