"""Recent/past classification of evaluation questions (no model, no database)."""

from __future__ import annotations

import datetime as dt
from types import SimpleNamespace

import pytest

from workers.config import EvalConfig
from workers.evaluate import classify_subset, reader_sample

D = dt.date


def question(meta, asked=D(2023, 6, 10), answers=("Ada Quist",)):
    return SimpleNamespace(id=1, meta=meta, asked=asked, answers=list(answers))


ARTICLES = {
    "gold-new": (D(2023, 6, 5), "Ada Quist won."),
    "old-hit": (D(2023, 1, 5), "Back in January Ada Quist won."),
    "new-miss": (D(2023, 6, 8), "Nobody we know won."),
    "future-hit": (D(2023, 6, 20), "Ada Quist won again."),
}


@pytest.mark.parametrize(
    "meta, expected",
    [
        ({"recent_or_past": "past"}, "past"),  # StreamingQA says it
        ({"gold_urls": ["gold-new"]}, "recent"),
        ({"search_result_urls": ["old-hit", "new-miss"]}, "past"),  # only the old article holds the answer
        ({"search_result_urls": ["new-miss", "future-hit"]}, "unknown"),  # later evidence does not count
        ({}, "unknown"),
    ],
)
def test_classify_subset_uses_evidence_before_the_question(meta, expected):
    assert classify_subset(question(meta), ARTICLES) == expected


def test_reader_sample_is_seeded_and_bounded():
    qs = [SimpleNamespace(id=i) for i in range(100)]
    a = reader_sample(qs, EvalConfig(max_questions=10, seed=3))
    assert len(a) == 10 and a == reader_sample(qs, EvalConfig(max_questions=10, seed=3))
    assert reader_sample(qs, EvalConfig(max_questions=0)) == set(range(100))
