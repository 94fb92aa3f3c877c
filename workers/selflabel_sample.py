"""A sample of self-labeled questions from stored articles, for inspection (`sqa selflabel`).

The generator itself (`models.selflabel`) takes any articles; this job picks them from the
database.
"""

from __future__ import annotations

import datetime as dt
import random

from sqlalchemy import select
from sqlalchemy.orm import Session

from indexer.dates import next_month, parse_month
from models.selflabel import ArticleText, GeneratedQuestion, GenerationStats, generate_questions
from store.tables import Article


def sample_from_database(
    session: Session,
    *,
    until: dt.date | None = None,
    month: str | None = None,
    n: int = 30,
    seed: int = 0,
    max_articles: int = 200,
) -> tuple[list[GeneratedQuestion], GenerationStats]:
    """n random questions from max_articles random articles published before `until` or in `month`
    ("YYYY-MM"), for inspection; the same seed gives the same sample. Returns (questions by date, stats)."""
    if until is not None and month is not None:
        raise ValueError("give at most one of until and month")
    if n < 1 or max_articles < 1:
        raise ValueError(f"n and max_articles must be positive, not {n} and {max_articles}")
    query = select(Article.id)
    if until is not None:
        query = query.where(Article.published < until)
    if month is not None:
        first = parse_month(month)
        query = query.where(Article.published >= first, Article.published < next_month(first))
    ids = sorted(session.scalars(query))
    rng = random.Random(seed)
    picked = sorted(rng.sample(ids, min(max_articles, len(ids))))
    articles = []
    for k in range(0, len(picked), 500):  # SQLite allows at most 999 bound parameters
        rows = session.scalars(select(Article).where(Article.id.in_(picked[k : k + 500])).order_by(Article.id))
        articles.extend(ArticleText(a.url, a.title or "", a.text or "", a.published) for a in rows)
    stats = GenerationStats()
    questions = list(generate_questions(articles, seed=seed, stats=stats))
    sample = rng.sample(questions, min(n, len(questions)))
    return sorted(sample, key=lambda q: (q.published, q.url, q.question)), stats
