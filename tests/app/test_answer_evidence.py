"""Which passages state an answer (the API's `grounded` and `evidence`)."""

from __future__ import annotations

import datetime as dt

from indexer.chunking import split_passages
from models.reader_base import RetrievedPassage
from serving.answering import AnswerResult, answer_evidence

DAY = dt.date(2019, 2, 8)  # a Friday


def _passage(text: str, title: str = "") -> RetrievedPassage:
    body = split_passages(text)[0]  # as stored: the body, no date
    passage = RetrievedPassage(title, body, DAY)
    assert passage.dated_text.startswith("Friday, February 8, 2019. ")  # what a reader reads
    return passage


def test_answer_evidence_reads_headline_and_text_but_not_the_date_prefix():
    passages = [
        _passage("The vote was held on Monday.", "Senate passes the bill"),
        _passage("Turnout reached 61 percent.", "A second vote on Friday"),
        _passage("Nothing to see."),
    ]
    assert answer_evidence("Friday", passages) == [1]  # the headline, not the date every passage starts with
    assert answer_evidence("Monday", passages) == [0]
    assert answer_evidence("the Senate", passages) == [0]
    assert answer_evidence("61 percent", passages) == [1]
    assert answer_evidence("2019", passages) == []  # only in the date prefixes
    assert answer_evidence("", passages) == []


def test_an_answer_result_is_grounded_only_with_evidence():
    kw = dict(as_of=DAY, passages=[], versions={}, timings_ms={})
    assert AnswerResult("x", **kw, evidence=[7]).grounded
    assert not AnswerResult("x", **kw).grounded
