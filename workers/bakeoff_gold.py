"""The reader bake-off's database part: the stored passage that holds a question's gold answer.

The pure parts (generation subset, baselines, scoring) are `evaluation/bakeoff.py`.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import select
from sqlalchemy.orm import Session

from evaluation.metrics import answer_in_text
from evaluation.questions import DatedQuestion
from store.tables import Article, Passage, Question


def gold_passage(session: Session, question: DatedQuestion):
    """The passage that holds a gold answer and was published on or before the question date.

    Looks in the articles of the question's `gold_urls` (the quiz's own citation) first, then its
    `search_result_urls` in search order, each article's passages in order; the first passage
    whose body (date prefix left out) contains a gold answer as a whole-token span wins. Nothing
    published after `question.asked` is ever returned. None when no such passage is stored (the
    article was never ingested, or does not state the answer in one passage).

    Returns:
        A `Passage` row (its `article` loaded), or None.
    """
    meta = question.meta or {}
    urls = list(dict.fromkeys([*meta.get("gold_urls", []), *meta.get("search_result_urls", [])]))
    if not urls or not question.answers:
        return None
    rank = {u: i for i, u in enumerate(urls)}
    articles = []
    for i in range(0, len(urls), 500):
        articles += session.execute(
            select(Article.id, Article.url).where(
                Article.url.in_(urls[i : i + 500]), Article.published <= question.asked
            )
        ).all()
    if not articles:
        return None
    article_rank = {aid: rank[url] for aid, url in articles}
    rows = session.scalars(
        select(Passage)
        .where(Passage.article_id.in_(list(article_rank)), Passage.published <= question.asked)
        .order_by(Passage.ordinal, Passage.id)
    ).all()
    for row in sorted(rows, key=lambda r: (article_rank[r.article_id], r.ordinal, r.id)):
        if answer_in_text(question.answers, row.text):
            return row
    return None


def load_questions(sessions, first: dt.date, last: dt.date) -> list[DatedQuestion]:
    """The questions asked in [first, last], by day, as plain values."""
    with sessions() as session:
        rows = session.scalars(
            select(Question).where(Question.asked.between(first, last)).order_by(Question.asked, Question.qid)
        ).all()
        return [DatedQuestion.of(q) for q in rows]
