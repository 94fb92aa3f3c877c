"""The import job: records from an importer -> the database, in one transaction, idempotently."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session, sessionmaker

from indexer.records import ArticleRecord, QuestionRecord
from serving.index_state import latest_snapshot_row
from store.queries import UpsertCounts, upsert_articles, upsert_questions


@dataclass(frozen=True)
class StoreResult:
    articles: UpsertCounts
    questions: UpsertCounts
    stale_months: list[str]  # indexed months whose articles changed: re-ingest them


def store_records(
    sf: sessionmaker[Session], articles: Sequence[ArticleRecord], questions: Sequence[QuestionRecord]
) -> StoreResult:
    """Upsert everything or nothing (one transaction)."""
    with sf() as session, session.begin():
        a = upsert_articles(session, articles)
        q = upsert_questions(session, questions)
        row = latest_snapshot_row(session)
        indexed = set(row.shard_keys) if row else set()
    return StoreResult(a, q, sorted(m for m in a.changed_months if m in indexed))
