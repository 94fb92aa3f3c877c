"""The feeds the worker polls (workers/feed_poller.py): `GET /admin/feeds` (each feed's health, for the
dashboard), `POST /admin/feeds` (add one) and `DELETE /admin/feeds?url=...` (stop polling one).

The worker's feed poller picks a new feed up at its next look (seconds); `sqa feeds poll` polls now.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Response, status

from app.api.deps import AdminDep, SessionDep
from app.api.schemas import ADMIN_ERRORS, FeedPublic, FeedRequest
from workers.feed_poller import add_feed, feed_dict, feed_status, remove_feed

router = APIRouter(prefix="/admin", tags=["admin"], dependencies=[AdminDep], responses=ADMIN_ERRORS)


@router.get("/feeds", response_model=list[FeedPublic])
def get_feeds(session: SessionDep) -> list[dict]:
    """Every feed with its last fetch, HTTP status, error, consecutive failures and articles."""
    return feed_status(session)


@router.post("/feeds", response_model=FeedPublic, status_code=status.HTTP_201_CREATED)
def post_feed(body: FeedRequest, session: SessionDep) -> dict:
    """Add a feed; it is due at once."""
    feed = add_feed(session, body.url, body.source)  # 422 a bad URL, 409 a duplicate
    session.commit()
    return feed_dict(feed)


@router.delete("/feeds", status_code=status.HTTP_204_NO_CONTENT)
def delete_feed(session: SessionDep, url: str = Query(..., max_length=2048, description="the feed's URL")) -> Response:
    """Stop polling a feed; the articles it brought stay."""
    remove_feed(session, url)
    session.commit()
    return Response(status_code=status.HTTP_204_NO_CONTENT)
