"""scripts/demo.py's choice of questions: ones whose evidence the index holds, one a month."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from app.bootstrap.builders import open_database
from evaluation.metrics import answer_in_evidence, answer_in_text
from indexer.dates import months_before
from scripts import demo
from store.tables import Article, Question


def _stored(settings):
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            return s.scalars(select(Question)).all(), s.scalars(select(Article)).all()
    finally:
        db.close()


def test_without_cited_articles_it_asks_questions_some_earlier_passage_gives_evidence_for(loaded_settings):
    chosen = demo.pick_questions("2024-01-01", "2024-03-31", settings=loaded_settings)
    _, articles = _stored(loaded_settings)
    assert len(chosen) == 3
    assert len({asked[:7] for _, asked, _ in chosen}) == 3  # one a month
    for text, asked, gold in chosen:
        day = dt.date.fromisoformat(asked)
        assert any(a.published <= day and answer_in_evidence(gold, text, a.text) for a in articles), gold


@pytest.mark.parametrize("key", ["gold_urls", "search_result_urls"])
def test_with_own_articles_it_asks_only_questions_whose_own_article_holds_the_answer(loaded_settings, key):
    """The cited gold article, or the search results where a question cites none: evidence elsewhere
    in the index (another story that happens to hold "4") does not make a question answerable."""
    questions, articles = _stored(loaded_settings)
    first = min(questions, key=lambda q: (q.asked, q.qid))
    holding = next(
        a for a in articles if a.published <= first.asked and answer_in_evidence(first.answers[0], first.text, a.text)
    )

    def lacking(q):
        return next(a for a in articles if not answer_in_text(q.answers[0], a.text))

    db = open_database(loaded_settings, migrate=False)
    try:
        with db.sessions() as s:  # every question cites an article without its answer, but the first
            for q in s.scalars(select(Question)).all():
                meta = {k: v for k, v in (q.meta or {}).items() if k not in ("gold_urls", "search_result_urls")}
                q.meta = {**meta, key: [holding.url if q.qid == first.qid else lacking(q).url]}
            s.commit()
    finally:
        db.close()
    chosen = demo.pick_questions("2024-01-01", "2024-03-31", settings=loaded_settings)
    assert chosen == [(first.text, first.asked.isoformat(), first.answers[0])]


def test_the_first_round_asks_only_what_the_newest_month_alone_answers(loaded_settings):
    """The demo's first answers come from the newest month alone (indexed first): each question's
    evidence lies in a passage published in that month, and no two questions share a week."""
    chosen = demo.pick_questions(
        "2024-03-01", "2024-03-31", settings=loaded_settings, indexed_from="2024-03-01", per="week"
    )
    _, articles = _stored(loaded_settings)
    assert chosen
    assert len({dt.date.fromisoformat(asked).isocalendar()[:2] for _, asked, _ in chosen}) == len(chosen)
    for text, asked, gold in chosen:
        day = dt.date.fromisoformat(asked)
        assert any(
            dt.date(2024, 3, 1) <= a.published <= day and answer_in_evidence(gold, text, a.text) for a in articles
        ), gold
    earlier = demo.pick_questions("2024-03-01", "2024-03-31", settings=loaded_settings, per="week")
    for text, asked, gold in set(earlier) - set(chosen):  # left out: only earlier news holds their answer
        day = dt.date.fromisoformat(asked)
        assert not any(
            dt.date(2024, 3, 1) <= a.published <= day and answer_in_evidence(gold, text, a.text) for a in articles
        ), gold


def test_the_recent_months_are_indexed_and_trained_on_before_the_older_ones_are_backfilled():
    steps = demo.demo_backfill("2022-06-01", "2023-04-01", "2023-06-30", 4, 10.0)
    assert steps == [
        ("ingest", "--through", "2023-04", "--from", "2022-12", "--train-minutes", "10.0"),
        ("ingest", "--through", "2023-06", "--no-train"),
        ("ingest", "--through", "2022-11", "--from", "2022-06", "--no-train"),
    ]
    # 0 months, or more months than there are: every month before the training, nothing to backfill
    for months in (0, 12, 40):
        first, second = demo.demo_backfill("2022-06-01", "2023-04-01", "2023-06-30", months, 5.0)
        assert first == ("ingest", "--through", "2023-04", "--from", "2022-06", "--train-minutes", "5.0")
        assert second == ("ingest", "--through", "2023-06", "--no-train")
    # across a year's turn (indexer.dates.months_before, which the web page's "a month earlier" link uses too)
    assert months_before(dt.date(2023, 1, 1), 1) == dt.date(2022, 12, 1)
    assert months_before(dt.date(2023, 1, 1), 13) == dt.date(2021, 12, 1)
