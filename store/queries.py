"""Small query helpers shared by the CLI, the API and the jobs."""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from indexer.dates import month_key
from indexer.manifest import Manifest, write_manifest
from indexer.records import ArticleRecord, QuestionRecord
from indexer.storage import IndexStore
from store.tables import Article, IndexSnapshot, Passage, Question

CHUNK = 500

T = TypeVar("T")


@dataclass
class UpsertCounts:
    inserted: int = 0
    updated: int = 0
    unchanged: int = 0
    changed_months: set[str] = field(default_factory=set)  # months whose indexed text may be stale


def _chunks(items: Sequence[T], n: int = CHUNK) -> Iterable[Sequence[T]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]


def upsert_articles(session: Session, records: Sequence[ArticleRecord]) -> UpsertCounts:
    """Insert new articles by URL; where a URL exists, keep the longer text. Idempotent."""
    counts = UpsertCounts()
    for chunk in _chunks(records):
        existing = {a.url: a for a in session.scalars(select(Article).where(Article.url.in_([r.url for r in chunk])))}
        for rec in chunk:
            row = existing.get(rec.url)
            if row is None:
                session.add(
                    Article(
                        url=rec.url,
                        title=rec.title,
                        text=rec.text,
                        published=rec.published,
                        source=rec.source,
                        content_hash=rec.content_hash,
                    )
                )
                counts.inserted += 1
                counts.changed_months.add(month_key(rec.published))
            elif len(rec.text) > len(row.text) or (
                row.published != rec.published
                and len(rec.text) == len(row.text)
                and rec.content_hash != row.content_hash
            ):
                counts.changed_months.update({month_key(row.published), month_key(rec.published)})
                row.text, row.title, row.published = rec.text, rec.title or row.title, rec.published
                row.content_hash = rec.content_hash
                counts.updated += 1
            else:
                counts.unchanged += 1
        session.flush()
    return counts


def upsert_questions(session: Session, records: Sequence[QuestionRecord]) -> UpsertCounts:
    """Insert new questions by qid; update those whose text, date or answers changed. Idempotent."""
    counts = UpsertCounts()
    for chunk in _chunks(records):
        existing = {q.qid: q for q in session.scalars(select(Question).where(Question.qid.in_([r.qid for r in chunk])))}
        for rec in chunk:
            row = existing.get(rec.qid)
            values = dict(
                text=rec.text,
                asked=rec.asked,
                answers=list(rec.answers),
                choices=list(rec.choices),
                subset=rec.subset,
                meta=dict(rec.meta),
            )
            if row is None:
                session.add(Question(qid=rec.qid, **values))
                counts.inserted += 1
            elif any(getattr(row, k) != v for k, v in values.items()):
                for k, v in values.items():
                    setattr(row, k, v)
                counts.updated += 1
            else:
                counts.unchanged += 1
        session.flush()
    return counts


def article_months(session: Session) -> dict[str, int]:
    """Article count per month 'YYYY-MM' (computed in Python: portable across SQLite and PostgreSQL)."""
    out: dict[str, int] = {}
    for day, n in session.execute(select(Article.published, func.count()).group_by(Article.published)):
        key = month_key(day)
        out[key] = out.get(key, 0) + n
    return out


def earliest_question_day(session: Session) -> dt.date | None:
    return session.scalar(select(func.min(Question.asked)))


def answer_forms_before(session: Session, day: dt.date) -> list[str]:
    """The gold answers and the choices of every question asked before `day`, one string each time
    it was written: what `models.answer_forms.AnswerForms` learns the quizzes' answer forms from."""
    forms: list[str] = []
    for answers, choices in session.execute(select(Question.answers, Question.choices).where(Question.asked < day)):
        forms += [a for a in [*(answers or []), *(choices or [])] if isinstance(a, str)]
    return forms


def newest_indexed_article_at(session: Session, manifest: Manifest | None) -> dt.datetime | None:
    """When the newest searchable article arrived: the latest store or change time of an article
    with passages in the snapshot `manifest`'s shard builds (None: no snapshot, no article)."""
    builds = [e.build for e in manifest.shards] if manifest is not None else []
    if not builds:
        return None
    stamp = func.coalesce(Article.updated_at, Article.imported_at)
    value = session.scalar(
        select(func.max(stamp)).join(Passage, Passage.article_id == Article.id).where(Passage.build_id.in_(builds))
    )
    if value is not None and not isinstance(value, dt.datetime):  # SQLite hands back the stored text
        value = dt.datetime.fromisoformat(str(value))
    if value is not None and value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)
    return value


def add_snapshot(
    session: Session,
    index_dir: IndexStore | str | os.PathLike[str],
    manifest: Manifest,
    *,
    job_id: int | None = None,
    kind: str = "serving",
    label: str | None = None,
) -> IndexSnapshot:
    """Write `manifest` under `index_dir` and add its snapshot row to `session` (committed with the
    caller's transaction: until then no reader sees the snapshot)."""
    name, sha = write_manifest(index_dir, manifest)
    row = IndexSnapshot(
        snapshot_id=manifest.snapshot_id,
        manifest_file=name,
        manifest_sha256=sha,
        encoder=manifest.encoder,
        dim=manifest.dim,
        total=manifest.total,
        shard_keys=[e.key for e in manifest.shards],
        job_id=job_id,
        kind=kind,
        label=label,
    )
    session.add(row)
    return row
