"""Fusing dense and BM25 rankings."""

from __future__ import annotations

import datetime as dt
import math

import pytest

from indexer.dates import day_number
from indexer.fusion import recency_prior, reciprocal_rank_fusion, weighted_fusion
from indexer.ids import make_id


def test_rrf_ranks_a_passage_in_both_lists_above_the_top_of_one():
    fused = reciprocal_rank_fusion([[1, 2, 3], [4, 2, 5]], k=5)
    assert [pid for pid, _ in fused] == [2, 1, 4, 3, 5]
    assert fused[0][1] == pytest.approx(1 / 62 + 1 / 62)
    assert fused[1][1] == pytest.approx(1 / 61)


def test_rrf_breaks_ties_by_first_appearance():
    assert [p for p, _ in reciprocal_rank_fusion([[7, 8], [9, 10]], k=4)] == [7, 9, 8, 10]
    assert reciprocal_rank_fusion([[], [3]], k=1) == [(3, pytest.approx(1 / 61))]


def test_weighted_fusion_normalises_each_list_and_weights_them():
    dense = [(1, 0.9), (2, 0.8), (3, 0.1)]
    bm25 = [(3, 12.0), (4, 6.0), (1, 0.0)]
    assert [p for p, _ in weighted_fusion([dense, bm25], [1.0, 0.0], k=4)] == [1, 2, 3, 4]
    assert [p for p, _ in weighted_fusion([dense, bm25], [0.0, 1.0], k=4)] == [3, 4, 1, 2]
    half = dict(weighted_fusion([dense, bm25], [0.5, 0.5], k=4))
    assert half[3] == pytest.approx(0.5) and half[1] == pytest.approx(0.5) and half[4] == pytest.approx(0.25)


def test_fusion_rejects_bad_arguments():
    with pytest.raises(ValueError, match="k must be"):
        reciprocal_rank_fusion([[1]], k=0)
    with pytest.raises(ValueError, match="one non-negative weight per list"):
        weighted_fusion([[(1, 1.0)]], [0.5, 0.5], k=1)


def test_recency_prior_lets_a_fresh_passage_overtake_an_older_one_of_nearly_the_same_score():
    as_of = dt.date(2023, 4, 10)
    old, fresh = make_id(dt.date(2023, 1, 10), 0), make_id(dt.date(2023, 4, 9), 1)
    hits = [(old, 0.80), (fresh, 0.75)]
    ranked = recency_prior(hits, day_number(as_of), 0.05, k=2)
    assert [i for i, _ in ranked] == [fresh, old]
    assert ranked[0][1] == pytest.approx(0.75 - 0.05 * math.log1p(1))
    assert ranked[1][1] == pytest.approx(0.80 - 0.05 * math.log1p(90))
    # a weight of 0 changes nothing, and k cuts the list
    assert recency_prior(hits, day_number(as_of), 0.0, k=1) == [(old, 0.80)]


def test_recency_prior_counts_a_same_day_passage_as_age_zero_and_rejects_bad_weights():
    day = dt.date(2023, 4, 10)
    assert recency_prior([(make_id(day, 3), 0.5)], day_number(day), 1.0, k=5) == [(make_id(day, 3), 0.5)]
    assert recency_prior([], day_number(day), 1.0, k=5) == []
    with pytest.raises(ValueError):
        recency_prior([(make_id(day, 3), 0.5)], day_number(day), -0.1, k=5)
