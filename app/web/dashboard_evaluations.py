"""The dashboard's evaluation pages (`/dashboard/evaluations`): every run with its scores, the trend
of the scores across runs, and one run's report (written by evaluation/report.py) with its plots.
"""

from __future__ import annotations

import io
import re

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse, Response
from markupsafe import Markup
from sqlalchemy import case, func, select

from app.api.deps import RowId, SessionDep, SettingsDep
from app.api.routes import evaluations
from app.web import session as web_session
from app.web.dashboard_auth import SessionCookie
from app.web.templating import templates
from serving.errors import NotFoundError
from store.tables import EvalResult, EvalRun

router = APIRouter(prefix="/dashboard", include_in_schema=False)


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
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415 (lazy: matplotlib)
    from matplotlib.figure import Figure  # noqa: PLC0415 (lazy: matplotlib)

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
