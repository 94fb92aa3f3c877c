"""The ask page (`/`): a question as of a date, the answer and its evidence on a time axis, and the
same question as of a second date beside it."""

from __future__ import annotations

import datetime as dt

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from app.api.deps import AnswerGateDep, AnswerServiceDep, SessionDep
from app.api.operator_metrics import observe_answers
from app.api.request_ids import arrived_at
from app.api.routes.articles import live_status
from app.web.templating import templates
from app.web.views import ago, answer_view, ask_url, parse_as_of, parse_top_k
from evaluation.subsets import needs_choices
from indexer.dates import InvalidDateError, months_before
from serving.errors import ServiceError
from store.tables import Question

router = APIRouter(include_in_schema=False)


def _field_of(message: str) -> str:
    """Which form field a service error is about (its message names it)."""
    if message.startswith("top_k"):
        return "top_k"
    if message.startswith("question"):
        return "q"
    return "form"


def _indexed(service) -> tuple[str, str] | None:
    """The first and last day of the serving index (what a question's date can reach)."""
    snap = service.index_state.current()
    if snap is None or not snap.manifest.shards:
        return None
    return min(e.min_day for e in snap.manifest.shards), max(e.max_day for e in snap.manifest.shards)


def _examples(session, indexed: tuple[str, str] | None, n: int = 3) -> list[dict]:
    """Stored questions dated inside the index, one per month from the newest: something to try."""
    if indexed is None:
        return []
    rows = session.execute(
        select(Question.text, Question.asked)
        .where(Question.asked >= dt.date.fromisoformat(indexed[0]), Question.asked <= dt.date.fromisoformat(indexed[1]))
        .order_by(Question.asked.desc(), Question.id)
        .limit(200)
    ).all()
    out, months = [], set()
    for text, asked in rows:  # "which of these..." reads badly without its choices
        if not needs_choices(text) and asked.strftime("%Y-%m") not in months and len(text) <= 160:
            months.add(asked.strftime("%Y-%m"))
            out.append({"text": text, "as_of": asked.isoformat(), "url": ask_url(text, asked)})
        if len(out) == n:
            break
    return out


def freshness(request: Request, session) -> dict:
    """How fresh the serving index is: the newest searchable article's arrival, and what still waits."""
    live = live_status(request, session)
    return {
        "newest_ago": ago(live.newest_article_at),
        "newest_at": live.newest_article_at,
        "waiting": live.waiting,
        "published_ago": ago(live.last_publish_at),
        "months": live.months,
        "oldest_waiting_ago": ago(live.oldest_waiting_at),
        "broker": live.broker,
        "broker_ago": ago(live.broker.last_message_at) if live.broker else None,
    }


@router.get("/", response_class=HTMLResponse)
def ask_page(
    request: Request,
    service: AnswerServiceDep,
    session: SessionDep,
    gate: AnswerGateDep,
    q: str = Query("", max_length=5000),
    as_of: str = Query("", max_length=40),
    top_k: str = Query("", max_length=10),
    compare: str = Query("", max_length=40),
) -> HTMLResponse:
    """Ask: the question box, the date picker and top-k; with `q`, the answer(s)."""
    today = dt.datetime.now(dt.UTC).date()
    limits = service.limits
    errors: dict[str, str] = {}
    form = {"q": q, "as_of": as_of or today.isoformat(), "top_k": top_k, "compare": compare}
    views = []
    day = other = k = None
    status = 200
    headers: dict[str, str] = {}
    if q.strip() or request.query_params:
        try:
            day = parse_as_of(form["as_of"], what="as_of")
        except InvalidDateError as exc:
            errors["as_of"] = str(exc)
        if compare.strip():
            try:
                other = parse_as_of(compare, what="the second date")
            except InvalidDateError as exc:
                errors["compare"] = str(exc)
        try:
            k = parse_top_k(top_k, limits.default_top_k, limits.max_top_k)
        except ValueError as exc:
            errors["top_k"] = str(exc)
        if not q.strip():
            errors["q"] = "type a question"
    if q.strip() and not errors:
        try:
            dates = [day] if other is None else [day, other]
            found = [service.cached(q, d, k) for d in dates]  # asked before: no turn at the gate
            queued_s = None
            if any(r is None for r in found):
                with gate.admit(since=arrived_at(request)) as queued_s:  # both dates in one turn
                    found = [r if r is not None else service.answer(q, d, k) for r, d in zip(found, dates)]
            results = [r for r in found if r is not None]
            observe_answers(request, results, queued_s)
        except ServiceError as exc:
            errors[_field_of(str(exc))] = str(exc)
            status = exc.status_code
            headers.update(getattr(exc, "headers", None) or {})
        else:
            ids = [{p.passage_id for p in r.passages} for r in results]
            n_read = service.passages_for(service.reader)
            views = [answer_view(r, n_read, ids[1 - i] if len(results) == 2 else None) for i, r in enumerate(results)]
    links = {}
    if views:
        links["permalink"] = ask_url(q, day, k if top_k else None, other)
        links["month_earlier"] = ask_url(q, day, k if top_k else None, months_before(day, 1))
        links["year_earlier"] = ask_url(q, day, k if top_k else None, months_before(day, 12))
    if errors and status == 200:
        status = 422
    indexed = _indexed(service)
    return templates.TemplateResponse(
        request,
        "ask.html",
        {
            "indexed": indexed,
            "freshness": freshness(request, session),
            "examples": [] if views else _examples(session, indexed),
            "form": form,
            "errors": errors,
            "views": views,
            "links": links,
            "max_top_k": limits.max_top_k,
            "default_top_k": limits.default_top_k,
            "today": today.isoformat(),
        },
        status_code=status,
        headers=headers,
    )
