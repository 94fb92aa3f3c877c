"""Live intake: pushed, polled or watched articles -> the articles table and the live queue, in the
caller's transaction, idempotently.

- A URL not seen before is `new` (version 1).
- A URL seen with the same text, title and day is a `duplicate`: nothing changes.
- A URL seen with another text, title or day is `updated`: the row becomes version n + 1 and its
  passages of version n are retired from the next snapshot (`workers.live_publisher`).
New and updated articles are queued (`LiveQueueItem`) in the same transaction, so an article that
was acknowledged is either searchable or waiting, never lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from indexer.dates import month_key
from indexer.records import ArticleRecord
from store.base import utcnow
from store.tables import Article, LiveQueueItem

CHUNK = 500
OUTCOMES = ("new", "updated", "duplicate")


@dataclass
class IntakeCounts:
    new: int = 0
    updated: int = 0
    duplicate: int = 0
    outcomes: list[str] = field(default_factory=list)  # one of OUTCOMES per record, in order
    article_ids: list[int] = field(default_factory=list)  # the row of each record, in order

    def add(self, other: IntakeCounts) -> None:
        self.new += other.new
        self.updated += other.updated
        self.duplicate += other.duplicate
        self.outcomes += other.outcomes
        self.article_ids += other.article_ids

    def to_dict(self) -> dict[str, int]:
        return {"new": self.new, "updated": self.updated, "duplicate": self.duplicate}


def _queue(session: Session, article: Article, via: str) -> None:
    item = session.scalar(select(LiveQueueItem).where(LiveQueueItem.article_id == article.id))
    if item is None:
        session.add(
            LiveQueueItem(article_id=article.id, version=article.version, month=month_key(article.published), via=via)
        )
    else:  # still waiting: it now waits for the newer version
        item.version, item.month, item.queued_at, item.via = (
            article.version,
            month_key(article.published),
            utcnow(),
            via,
        )


def _same(row: Article, rec: ArticleRecord) -> bool:
    return row.content_hash == rec.content_hash and row.published == rec.published and row.title == rec.title


def intake_articles(session: Session, records: Sequence[ArticleRecord], *, via: str = "api") -> IntakeCounts:
    """Store `records` (already checked, unique by URL) and queue the new and changed ones for the
    live shard. Runs in the caller's transaction; returns what happened to each record."""
    counts = IntakeCounts()
    for start in range(0, len(records), CHUNK):
        chunk = records[start : start + CHUNK]
        existing = {a.url: a for a in session.scalars(select(Article).where(Article.url.in_([r.url for r in chunk])))}
        for rec in chunk:
            row = existing.get(rec.url)
            if row is not None and _same(row, rec):
                counts.duplicate += 1
                counts.outcomes.append("duplicate")
                counts.article_ids.append(row.id)
                continue
            if row is None:
                row = Article(
                    url=rec.url,
                    title=rec.title,
                    text=rec.text,
                    published=rec.published,
                    source=rec.source,
                    content_hash=rec.content_hash,
                    version=1,
                    authors=list(rec.authors),
                    language=rec.language,
                )
                session.add(row)
                existing[rec.url] = row
                counts.new += 1
                counts.outcomes.append("new")
            else:
                row.text, row.title, row.published, row.content_hash = (
                    rec.text,
                    rec.title,
                    rec.published,
                    rec.content_hash,
                )
                row.source = rec.source or row.source
                row.authors, row.language = list(rec.authors) or row.authors, rec.language or row.language
                row.version = (row.version or 1) + 1
                row.updated_at = utcnow()
                counts.updated += 1
                counts.outcomes.append("updated")
            session.flush()  # the row's id, for the queue
            _queue(session, row, via)
            counts.article_ids.append(row.id)
        session.flush()
    return counts
