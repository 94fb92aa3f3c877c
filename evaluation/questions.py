"""The one plain question: what the bake-off, the training data, the ranker's items and the benches
take. The ORM row (`store.tables.Question`) and the import record (`indexer.records.QuestionRecord`)
stay what the database and the importers hold; `DatedQuestion.of` turns either into this.

A self-labeled question (`models.selflabel.GeneratedQuestion`) stays a type of its own: it is the
generator's output (one answer, its spaCy label, the source sentence, the article's url, title and
date, which is not the day it is asked), and becomes a `DatedQuestion` where it is used as one
(`workers.train_ranker.self_question`).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DatedQuestion:
    qid: str  # the source's stable id (RealTimeQA question_id, StreamingQA qa_id) or a made-up one ("self-...")
    text: str
    asked: dt.date  # the question date: it is answered as of this day
    answers: tuple[str, ...]  # gold answers, best first
    # The source's extras: gold_urls and search_result_urls (where the gold passage is looked for), ...
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    @classmethod
    def of(cls, question: Any) -> DatedQuestion:
        """The plain question of a stored row or an import record (anything with qid, text, asked,
        answers and meta): the one place either becomes a `DatedQuestion`."""
        return cls(
            question.qid, question.text, question.asked, tuple(question.answers or ()), dict(question.meta or {})
        )
