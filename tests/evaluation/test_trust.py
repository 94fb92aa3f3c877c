"""The trust figures (evaluation/trust.py) the benchmark and every evaluation run report."""

from __future__ import annotations

import random

import pytest

from evaluation.trust import CONFIDENCE_BANDS, Judged, auc, confidence_band, confidence_bands, grounded_split


def test_confidence_bands_place_each_answer_once_and_rank_right_answers_first():
    right = [True, True, False, True, False, False]
    confidence = [1.0, 0.8, 0.7, 0.5, 0.1, None]  # the last: none given (an old cached answer)
    out = confidence_bands([Judged(r, None, c) for r, c in zip(right, confidence)])
    assert out["n"] == 5
    assert [(b["band"], b["n"], b["em"]) for b in out["bands"]] == [
        ("high", 3, 66.7),
        ("medium", 1, 100.0),
        ("low", 1, 0.0),
    ]  # 1.0 counts in "high"
    assert sum(b["share"] for b in out["bands"]) == pytest.approx(100.0, abs=0.2)
    # right answers (1.0, 0.8, 0.5) against wrong ones (0.7, 0.1): 5 of the 6 pairs ordered right
    assert out["auc"] == pytest.approx(5 / 6, abs=0.001)
    assert confidence_bands([Judged(True, True, None)]) == {}


def test_the_bands_cover_zero_to_one_without_a_gap():
    edges = sorted((lo, hi) for _, lo, hi in CONFIDENCE_BANDS)
    assert edges[0][0] == 0.0 and edges[-1][1] == 1.0
    assert all(a[1] == b[0] for a, b in zip(edges, edges[1:]))
    assert [confidence_band(c) for c in (0.0, 0.1499, 0.15, 0.6999, 0.7, 1.0)] == [
        "low",
        "low",
        "medium",
        "medium",
        "high",
        "high",
    ]


def test_auc_by_ranks_equals_counting_every_pair_ties_included():
    rng = random.Random(7)
    for _ in range(50):
        pos = [round(rng.random(), 1) for _ in range(rng.randint(1, 12))]  # one decimal: many ties
        neg = [round(rng.random(), 1) for _ in range(rng.randint(1, 12))]
        pairs = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))
        assert auc(pos, neg) == pytest.approx(pairs, abs=0.0006)
    assert auc([0.5], []) is None and auc([], [0.5]) is None


def test_grounded_split_leaves_out_answers_not_known_either_way():
    judged = [
        Judged(True, True, 0.9),
        Judged(False, True, 0.2),
        Judged(False, False, 0.1),
        Judged(True, False, 0.5),
        Judged(True, None, 0.5),
    ]
    assert grounded_split(judged) == {"share": 50.0, "n": 2, "em_grounded": 50.0, "em_otherwise": 50.0}
    assert grounded_split([Judged(True, None, 0.5)]) == {}


def test_the_documented_examples_hold():
    import doctest

    import evaluation.trust

    assert doctest.testmod(evaluation.trust).failed == 0


def _row(test, state, em, grounded=True, confidence=0.5):
    metrics = {"recall": 1.0} if em is None else {"recall": 1.0, "em": em, "f1": em}
    return {
        "test_quarter": test,
        "state_quarter": state,
        "metrics": metrics,
        "grounded": grounded,
        "confidence": confidence,
    }


def test_trust_by_quarter_judges_each_quarter_under_its_own_state_else_the_newest():
    from evaluation.trust import trust_by_quarter

    rows = [
        _row("2024Q1", "2023Q4", 0.0),
        _row("2024Q1", "2024Q1", 1.0),
        _row("2024Q1", "2024Q1", 1.0),
        _row("2024Q1", "2024Q2", 0.0),  # a later state: not what was served then
        _row("2024Q3", "2024Q1", 1.0),
        _row("2024Q3", "2024Q2", 0.0),  # no own state: the newest, 2024Q2
        _row("2024Q3", "2024Q2", None),
    ]  # retrieval only: no answer to judge
    out = trust_by_quarter(rows)
    assert list(out) == ["2024Q1", "2024Q3", "all"]
    assert (out["2024Q1"]["answers"], out["2024Q1"]["grounded"]["em_grounded"]) == (2, 100.0)
    assert (out["2024Q3"]["answers"], out["2024Q3"]["grounded"]["em_grounded"]) == (1, 0.0)
    assert out["all"]["answers"] == 3 and out["all"]["grounded"]["em_grounded"] == 66.7
    assert trust_by_quarter([_row("2024Q1", "2024Q1", None)]) == {}
