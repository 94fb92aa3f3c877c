"""RSS and Atom feeds, polled into the live queue: the feeds table (store/tables.py `Feed`) says what
to poll; each due feed is fetched, its entries become articles and go through `intake_articles`
(idempotent by URL: a repeated entry is a duplicate, a changed text an updated article).

- Fetches are conditional (If-None-Match / If-Modified-Since from the stored ETag / Last-Modified):
  an unchanged feed costs the host a 304 and us nothing. Politeness, retries, timeouts and the size
  cap are workers/feed_http.py's; parsing and HTML -> text are workers/feed_entries.py's.
- An entry whose content is short or missing (a summary-only feed) has its page fetched and its
  main text extracted (trafilatura); if that fails the summary is stored, not nothing.
- One bad entry is skipped and counted; the others are stored. One poll of a feed is one
  transaction: its articles and its row's new state commit together.
- A feed that fails (no answer, a 5xx after the retries, a 4xx, a body too large, not a feed) has
  the error on its row (`last_status`, `last_error`, `failures` + 1) and waits
  `interval * 2**failures` (at most a day) before the next try; a success resets the count.

`FeedPoller.run` is one of the loops `sqa worker` runs (app/bootstrap/__init__.py `worker_services`); it
never raises. `add_feed`, `list_feeds`, `remove_feed` and `feed_status` serve `sqa feeds` and
/admin/feeds.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
from sqlalchemy import or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from indexer.push import RecordError, check_article
from indexer.records import ArticleRecord
from serving.errors import ConflictError, InvalidInputError, NotFoundError
from store.base import utcnow
from store.intake import intake_articles
from store.tables import Feed
from workers.config import FeedConfig
from workers.feed_entries import (
    EntryDraft,
    FeedFormatError,
    entry_drafts,
    feed_language,
    feed_title,
    page_text,
    parse_feed,
)
from workers.feed_http import FetchError, PoliteFetcher

log = logging.getLogger(__name__)

MAX_URL_CHARS = 2048  # the feeds table's column
MAX_SOURCE_CHARS = 64


@dataclass(frozen=True)
class _Due:
    """What a poll needs of a feed row, read before any network wait (no session is held meanwhile)."""

    id: int
    url: str
    source: str
    etag: str | None
    last_modified: str | None


def _host(url: str) -> str:
    host = (urlsplit(url).hostname or "").lower()
    return host.removeprefix("www.")


class FeedPoller:
    """Polls the due feeds (`step`), in a loop (`run`) until `stop()`.

    `client`: an httpx.Client to fetch with (tests, proxies); by default one of our own, with
    `cfg.user_agent`, following redirects, closed when `run` ends.
    """

    def __init__(
        self, sessions: sessionmaker[Session], cfg: FeedConfig = FeedConfig(), *, client: httpx.Client | None = None
    ):
        self._sf, self._cfg = sessions, cfg
        self._own_client = client is None
        self._client = client or httpx.Client(
            headers={"User-Agent": cfg.user_agent}, follow_redirects=True, timeout=cfg.timeout_s
        )
        self._fetcher = PoliteFetcher(
            self._client,
            host_delay_s=cfg.host_delay_s,
            timeout_s=cfg.timeout_s,
            retries=cfg.retries,
            max_bytes=cfg.max_bytes,
            backoff_s=cfg.retry_backoff_s,
        )
        self._stop = threading.Event()
        self.last: dict | None = None  # the last step's counts
        self.last_error: str | None = None  # the last step's unexpected error (a feed's own is on its row)

    # ---- the loop -------------------------------------------------------------------------------------

    def step(self, *, every: bool = False) -> dict:
        """Poll every active feed that is due (`every`: every active feed); the counts, with one result per feed."""
        now = utcnow()
        with self._sf() as session:
            query = select(Feed).where(Feed.active.is_(True)).order_by(Feed.id)
            if not every:
                query = query.where(or_(Feed.next_fetch_at.is_(None), Feed.next_fetch_at <= now))
            due = [_Due(f.id, f.url, f.source, f.etag, f.last_modified) for f in session.scalars(query)]
        totals = {
            "feeds": 0,
            "ok": 0,
            "not_modified": 0,
            "errors": 0,
            "new": 0,
            "updated": 0,
            "duplicate": 0,
            "skipped": 0,
            "results": [],
        }
        for feed in due:
            if self._stop.is_set():
                break
            result = self.poll(feed)
            totals["feeds"] += 1
            totals[{"ok": "ok", "not-modified": "not_modified"}.get(result["outcome"], "errors")] += 1
            for key in ("new", "updated", "duplicate", "skipped"):
                totals[key] += result.get(key, 0)
            totals["results"].append(result)
        return totals

    def run(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    self.last, self.last_error = self.step(), None
                except Exception as exc:  # the database is down, say: try again at the next poll
                    self.last_error = f"{type(exc).__name__}: {exc}"
                    log.exception("feed poll failed; retrying in %.0f s", self._cfg.poll_s)
                self._stop.wait(self._cfg.poll_s)
        finally:
            self.close()

    def stop(self) -> None:
        """End `run` after the feed being polled."""
        self._stop.set()

    def close(self) -> None:
        if self._own_client:
            self._client.close()

    # ---- one feed -------------------------------------------------------------------------------------

    def poll(self, feed: _Due) -> dict:
        """Fetch, parse and store one feed; never raises (a failure is recorded on its row)."""
        result = {
            "url": feed.url,
            "outcome": "error",
            "status": None,
            "new": 0,
            "updated": 0,
            "duplicate": 0,
            "skipped": 0,
            "pages": 0,
            "error": None,
        }
        try:
            self._poll(feed, result)
        except FetchError as exc:
            self._failed(feed, result, exc.status, str(exc))
        except FeedFormatError as exc:
            self._failed(feed, result, result["status"], str(exc))
        except Exception as exc:  # a bug or the database: recorded like any failure, the other feeds go on
            log.exception("feed %s: poll failed", feed.url)
            self._failed(feed, result, result["status"], f"{type(exc).__name__}: {exc}")
        return result

    def _poll(self, feed: _Due, result: dict) -> None:
        headers = {}
        if feed.etag:
            headers["If-None-Match"] = feed.etag
        if feed.last_modified:
            headers["If-Modified-Since"] = feed.last_modified
        got = self._fetcher.get(feed.url, headers)
        result["status"] = got.status
        now = utcnow()
        if got.status == 304:  # unchanged: only the fetch is recorded
            with self._sf() as session, session.begin():
                row = session.get(Feed, feed.id)
                if row is not None:
                    self._ok(row, now, 304)
            result["outcome"] = "not-modified"
            return
        parsed = parse_feed(got.body, got.url, got.headers.get("content-type"))
        today = now.date()
        drafts, skipped = entry_drafts(parsed, got.url, today)
        source = (feed.source or _host(feed.url))[:MAX_SOURCE_CHARS]
        records: list[ArticleRecord] = []
        for draft in drafts:
            try:
                records.append(self._record(draft, source, feed_language(parsed), today, result))
            except RecordError as bad:
                skipped.append(f"{draft.url}: {bad.reason}")
        for reason in skipped:
            log.warning("feed %s: skipped %s", feed.url, reason)
        with self._sf() as session, session.begin():
            counts = intake_articles(session, records, via="feed")
            row = session.get(Feed, feed.id)
            if row is not None:  # removed while we fetched: its articles are stored all the same
                self._ok(row, now, got.status)
                row.etag = (got.headers.get("etag") or "")[:512] or None
                row.last_modified = (got.headers.get("last-modified") or "")[:128] or None
                row.title = feed_title(parsed) or row.title
                row.last_new = counts.new + counts.updated
                row.articles_total = (row.articles_total or 0) + counts.new
                if skipped:  # the poll worked; what it left out is said here, for the dashboard
                    row.last_error = f"skipped {len(skipped)} entr{'y' if len(skipped) == 1 else 'ies'}: {skipped[0]}"
        result.update(
            outcome="ok", new=counts.new, updated=counts.updated, duplicate=counts.duplicate, skipped=len(skipped)
        )

    def _record(self, draft: EntryDraft, source: str, language: str, today: dt.date, result: dict) -> ArticleRecord:
        """The entry as a checked article: its full text, from the feed or from its page (raises RecordError)."""
        text = draft.text
        if len(text) < self._cfg.full_text_chars:  # a summary: the article is on its page
            fallback = max(text, draft.summary, key=len)
            text = self._page_text(draft.url) or ""
            result["pages"] += 1
            if len(text) < len(fallback):
                text = fallback
        limits = self._cfg.limits
        title = draft.title or text.split("\n", 1)[0][:120]
        return check_article(
            {
                "url": draft.url,
                "title": title[: limits.max_title_chars],
                "text": text[: limits.max_text_chars],
                "published": draft.published.isoformat(),
                "source": source,
                "authors": list(draft.authors),
                "language": language,
            },
            limits,
            today,
        )

    def _page_text(self, url: str) -> str:
        try:
            page = self._fetcher.get(url)
        except FetchError as exc:
            log.warning("article page not fetched, its summary is stored: %s", exc)
            return ""
        return page_text(page.body, page.url) if page.status != 304 else ""

    def _ok(self, row: Feed, now: dt.datetime, status: int) -> None:
        row.last_fetch_at = row.last_ok_at = now
        row.last_status, row.last_error, row.failures = status, None, 0
        row.next_fetch_at = now + dt.timedelta(seconds=self._cfg.interval_s)

    def _failed(self, feed: _Due, result: dict, status: int | None, message: str) -> None:
        result.update(outcome="error", status=status, error=message)
        log.warning("feed %s: %s", feed.url, message)
        now = utcnow()
        try:
            with self._sf() as session, session.begin():
                row = session.get(Feed, feed.id)
                if row is None:
                    return
                row.failures = (row.failures or 0) + 1
                row.last_fetch_at, row.last_status, row.last_error = now, status, message[:4000]
                wait = min(self._cfg.interval_s * 2**row.failures, self._cfg.max_backoff_s)
                row.next_fetch_at = now + dt.timedelta(seconds=wait)
        except Exception:  # the database itself: the loop's next step tries again
            log.exception("feed %s: its failure could not be recorded", feed.url)


# ---- the feeds table (sqa feeds, /admin/feeds) ----------------------------------------------------------


def check_feed_url(url: str) -> str:
    """A feed URL, stripped; InvalidInputError unless it is an http(s) URL."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or any(c.isspace() for c in url):
        raise InvalidInputError(f"feed URL {url[:200]!r} is not an http(s) URL (such as https://example.org/rss.xml)")
    if len(url) > MAX_URL_CHARS:
        raise InvalidInputError(f"feed URL is {len(url):,} characters, more than the {MAX_URL_CHARS:,} allowed")
    return url


def add_feed(session: Session, url: str, source: str = "") -> Feed:
    """Add a feed, due at once (flushed, not committed). `source`: the articles' source name (default: the host)."""
    url = check_feed_url(url)
    source = (source or "").strip()
    if len(source) > MAX_SOURCE_CHARS:
        raise InvalidInputError(f"source {source[:80]!r}... is longer than {MAX_SOURCE_CHARS} characters")
    if session.scalar(select(Feed.id).where(Feed.url == url)) is not None:
        raise ConflictError(f"feed {url} is already polled (remove it first to add it again)")
    feed = Feed(url=url, source=source, title="", active=True, failures=0, last_new=0, articles_total=0)
    session.add(feed)
    try:
        session.flush()
    except IntegrityError:  # added by another client since the check (the caller's transaction rolls back)
        raise ConflictError(f"feed {url} is already polled (remove it first to add it again)") from None
    return feed


def list_feeds(session: Session) -> list[Feed]:
    return list(session.scalars(select(Feed).order_by(Feed.id)))


def remove_feed(session: Session, url: str) -> None:
    """Stop polling `url` (its articles stay). NotFoundError when no feed has that URL."""
    feed = session.scalar(select(Feed).where(Feed.url == (url or "").strip()))
    if feed is None:
        raise NotFoundError(f"no feed with URL {url[:200]!r} (list them: sqa feeds list, or GET /admin/feeds)")
    session.delete(feed)
    session.flush()


STATUS_FIELDS = (
    "url",
    "title",
    "source",
    "active",
    "last_fetch_at",
    "last_ok_at",
    "last_status",
    "last_error",
    "failures",
    "last_new",
    "articles_total",
    "next_fetch_at",
)


def feed_dict(feed: Feed) -> dict:
    """A feed's health as plain values (STATUS_FIELDS)."""
    return {name: getattr(feed, name) for name in STATUS_FIELDS}


def feed_status(session: Session) -> list[dict]:
    """Each feed's health, for the dashboard and GET /admin/feeds."""
    return [feed_dict(f) for f in list_feeds(session)]
