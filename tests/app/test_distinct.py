"""Distinct evidence (serving/distinct.py): copies of one story among the candidates become one
passage, at the best copy's rank, showing the freshest copy; different stories are all kept; the
retriever that does it fills the freed places from deeper candidates and is what SQA_DISTINCT_EVIDENCE builds."""

from __future__ import annotations

import datetime as dt

import pytest

from models.reader_base import RetrievedPassage
from serving.distinct import DistinctRetriever, collapse_copies, containment, shingles

STORM = (
    "Hurricane Ian made landfall near Fort Myers on Wednesday afternoon as a category four storm, "
    "flooding streets across the coast and leaving two million homes without power by the evening"
)
VOTE = "The city council voted on Tuesday to approve a new budget that raises spending on schools and parks"


def _p(pid, text, day, score, title="T"):
    return RetrievedPassage(title, text, dt.date(2022, 9, day), pid, pid, pid, f"https://x/{pid}", score)


def test_copies_collapse_to_the_freshest_at_the_best_rank():
    ranked = [
        _p(1, STORM, 28, 0.9),  # the story
        _p(2, VOTE, 27, 0.8),
        _p(3, STORM + " and officials said the toll would rise", 29, 0.7),  # an updated copy, a day later
        _p(4, STORM, 28, 0.6),  # the same article under another URL
    ]
    out = collapse_copies(ranked, 0.6)
    assert [(p.passage_id, p.score) for p in out] == [(3, 0.9), (2, 0.8)]


def test_different_stories_and_cut_differently_copies():
    half = " ".join(STORM.split()[:18])  # another outlet cut the story into a shorter passage
    assert containment(shingles(half), shingles(STORM)) == 1.0
    assert containment(shingles(VOTE), shingles(STORM)) == 0.0
    ranked = [_p(1, STORM, 28, 0.9), _p(2, half, 28, 0.8), _p(3, VOTE, 28, 0.7)]
    assert [p.passage_id for p in collapse_copies(ranked, 0.6)] == [1, 3]  # same day: the better-ranked copy
    assert [p.passage_id for p in collapse_copies(ranked[::2], 0.6)] == [1, 3]
    with pytest.raises(ValueError, match="threshold 0 must be in"):
        collapse_copies(ranked, 0)


class _Fixed:
    name, encoder = "fixed", None

    def __init__(self, passages):
        self.passages, self.asked = passages, []

    def retrieve(self, session, snapshot, question, as_of, top_k, timings=None):
        self.asked.append(top_k)
        return self.passages[:top_k]


def test_distinct_retriever_fills_freed_places_from_deeper_candidates():
    others = [
        "Parliament passed the farm bill after a long night of debate",
        "The central bank held interest rates steady for a third month",
        "A rare comet will be visible from the northern hemisphere this week",
        "The striking dock workers reached a pay deal with the port authority",
        "Scientists mapped the genome of an ancient wheat variety",
    ]
    base = _Fixed(
        [_p(1, STORM, 28, 0.9), _p(2, STORM, 28, 0.8), *[_p(10 + i, t, 20, 0.5 - i / 10) for i, t in enumerate(others)]]
    )
    retriever = DistinctRetriever(base, threshold=0.6)
    timings = {}
    out = retriever.retrieve(None, None, "q", dt.date(2022, 10, 1), 3, timings=timings)
    assert base.asked == [6] and [p.passage_id for p in out] == [1, 10, 11]
    assert retriever.name == "fixed+distinct0.6" and "distinct" in timings
    with pytest.raises(ValueError, match="must be in"):
        DistinctRetriever(base, threshold=1.5)


def test_the_setting_builds_it_over_the_ranking(loaded_settings):
    from app.bootstrap.builders import build_encoder, build_retriever

    encoder = build_encoder(loaded_settings)
    plain = build_retriever(loaded_settings, encoder)
    distinct = build_retriever(loaded_settings.model_copy(update={"distinct_evidence": 0.6}), encoder)
    assert not isinstance(plain, DistinctRetriever)
    assert isinstance(distinct, DistinctRetriever) and distinct.base.name == plain.name
