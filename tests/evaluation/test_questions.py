"""The one plain question: a stored row and an import record become the same `DatedQuestion`."""

from __future__ import annotations

import datetime as dt

from evaluation.questions import DatedQuestion
from indexer.records import QuestionRecord
from store.tables import Question


def test_dated_question_of_a_row_and_of_its_record_agree():
    meta = {"search_result_urls": ["https://news.example/a"]}
    record = QuestionRecord("q1", "Who won?", dt.date(2024, 2, 3), ("Ada Quist",), "realtimeqa", meta=meta)
    row = Question(qid="q1", text="Who won?", asked=dt.date(2024, 2, 3), answers=["Ada Quist"], meta=meta)
    plain = DatedQuestion.of(row)
    assert plain == DatedQuestion.of(record) == DatedQuestion("q1", "Who won?", dt.date(2024, 2, 3), ("Ada Quist",))
    assert (
        plain.answers == ("Ada Quist",) and plain.meta == meta and plain.meta is not meta
    )  # a copy: rows stay as stored


def test_dated_question_of_a_row_without_answers_or_meta():
    row = Question(qid="q2", text="Who?", asked=dt.date(2024, 2, 3), answers=None, meta=None)
    assert DatedQuestion.of(row) == DatedQuestion("q2", "Who?", dt.date(2024, 2, 3), ())
    assert DatedQuestion.of(row).meta == {}
