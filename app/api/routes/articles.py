"""Live news in: `POST /admin/articles` (a JSON array or NDJSON of articles), `POST /admin/live/publish`
(publish the live queue now) and `GET /admin/live` (what waits, and how fresh the index is).

Articles are stored and queued in one transaction (store/intake.py); the worker's live publisher
(workers/live_publisher.py) makes them searchable within seconds. `?publish=true` publishes in this request
(one process setups, tests and the replay benchmark).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import defaultdict

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from app.api.deps import AdminDep, JobsDep, SessionDep, SettingsDep
from app.api.request_ids import current_request_id
from app.api.schemas import (
    ADMIN_ERRORS,
    ArticleRejectedPublic,
    ArticleResultPublic,
    ArticlesStoredPublic,
    BrokerStatusPublic,
    LivePieceMonthPublic,
    LiveStatusPublic,
)
from app.bootstrap.job_configs import live_config, nats_config, push_limits
from indexer.push import BodyError, parse_articles
from indexer.shards import live_key_parts
from serving.errors import InvalidInputError
from store.intake import intake_articles
from store.queries import newest_indexed_article_at
from workers.live_publisher import publish_live, queue_status
from workers.nats_consumer import ConsumerStatus, read_status

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)

ARTICLES_BODY = {
    "content": {
        "application/json": {
            "schema": {"type": "array", "items": {"type": "object"}},
            "example": [
                {
                    "url": "https://example.org/a",
                    "title": "A",
                    "text": "Text.",
                    "published": "2024-04-14",
                    "source": "example",
                }
            ],
        },
        "application/x-ndjson": {"schema": {"type": "string"}},
    }
}


def _publish(request: Request, jobs) -> dict:
    answers = request.app.state.answers
    snap = answers.index_state.current()
    encoder = snap.encoder if snap is not None and snap.encoder is not None else answers.retriever.encoder
    result = publish_live(jobs.sessions, encoder, jobs.ingest, live_config(request.app.state.settings))
    answers.index_state.refresh()  # serve it from this process at once
    return result


@router.post("/articles", response_model=ArticlesStoredPublic, openapi_extra={"requestBody": ARTICLES_BODY})
async def post_articles(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    jobs: JobsDep,
    publish: bool = Query(False, description="publish the live queue before answering"),
):
    """Store a batch of articles (JSON array or NDJSON, one object a line): url, title, text, published
    (YYYY-MM-DD or an ISO 8601 time), source; optional authors, language. Each is new, updated (a
    changed text: a new version) or a duplicate; a bad record is rejected with its line and field,
    and the good ones are stored all the same."""
    body = await request.body()
    try:
        batch = parse_articles(body, today=dt.datetime.now(dt.UTC).date(), limits=push_limits(settings))
    except BodyError as exc:
        raise InvalidInputError(str(exc)) from None

    def store():
        with session.begin():
            counts = intake_articles(session, [r for _, r in batch.records], via="api")
        with jobs.sessions() as s:
            waiting = queue_status(s).waiting
        return counts, waiting

    counts, waiting = await run_in_threadpool(store)
    published = await run_in_threadpool(_publish, request, jobs) if publish and batch.records else None
    if published is not None:
        with jobs.sessions() as s:
            waiting = queue_status(s).waiting
    out = ArticlesStoredPublic(
        new=counts.new,
        updated=counts.updated,
        duplicate=counts.duplicate,
        rejected=len(batch.rejected),
        errors=[ArticleRejectedPublic(**r.to_dict()) for r in batch.rejected],
        results=[
            ArticleResultPublic(line=line, url=rec.url, outcome=outcome, article_id=aid)
            for (line, rec), outcome, aid in zip(batch.records, counts.outcomes, counts.article_ids)
        ],
        waiting=waiting,
        published=published,
    )
    if not batch.records:  # the error body every route answers with: one item a rejected record
        return JSONResponse(
            {
                "detail": f"no article was stored: {len(batch.rejected)} rejected "
                f"(first: line {batch.rejected[0].line}, {batch.rejected[0].reason})",
                "request_id": current_request_id(),
                "errors": [
                    {"loc": ["body", r.line, r.field], "msg": r.reason, "type": "article_rejected"}
                    for r in batch.rejected
                ],
            },
            status_code=422,
        )
    return out


@router.post("/live/publish")
def post_live_publish(request: Request, jobs: JobsDep) -> dict:
    """Publish what waits in the live queue now (the worker does it by itself within SQA_LIVE_MAX_WAIT_S)."""
    return _publish(request, jobs)


@router.get("/live", response_model=LiveStatusPublic)
def get_live(request: Request, session: SessionDep) -> LiveStatusPublic:
    """The live queue and the freshness of the serving index."""
    return live_status(request, session)


def live_status(request: Request, session) -> LiveStatusPublic:
    status = queue_status(session)
    snap = request.app.state.answers.index_state.current()
    months: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    if snap is not None:
        for e in snap.manifest.live:
            m = months[live_key_parts(e.key)[0]]
            m[0] += 1
            m[1] += e.count
    return LiveStatusPublic(
        waiting=status.waiting,
        oldest_waiting_at=status.oldest,
        last_publish_at=dt.datetime.fromisoformat(snap.manifest.created_at) if snap else None,
        newest_article_at=newest_indexed_article_at(session, snap.manifest if snap else None),
        newest_day=snap.newest_day if snap else None,
        months=[LivePieceMonthPublic(month=k, pieces=v[0], passages=v[1]) for k, v in sorted(months.items())],
        broker=_broker(request.app.state.settings),
    )


def _broker(settings) -> BrokerStatusPublic | None:
    """The worker's NATS consumer status (its file under the work dir), where SQA_NATS_URL is set."""
    if not settings.nats_url:
        return None
    data = read_status(nats_config(settings).status_file)
    if data is None:  # the worker has not started its consumer yet
        return BrokerStatusPublic.model_validate(
            {
                **dataclasses.asdict(ConsumerStatus(url=settings.nats_url, subject=settings.nats_subject)),
                "last_error": "no status yet: is `sqa worker` running?",
            }
        )
    try:
        return BrokerStatusPublic.model_validate(data)
    except ValueError:  # a file from another version
        return None
