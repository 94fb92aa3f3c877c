"""evaluation/paired.py: discordant counts, the exact McNemar test and bootstrap intervals of EM."""

from __future__ import annotations

import pytest

from evaluation.paired import describe_paired, em_interval, mcnemar_p, paired_em


def _systems(both: int, only_a: int, only_b: int, neither: int) -> tuple[dict, dict]:
    a, b, i = {}, {}, 0
    for right_a, right_b, count in (
        (True, True, both),
        (True, False, only_a),
        (False, True, only_b),
        (False, False, neither),
    ):
        for _ in range(count):
            a[f"q{i}"], b[f"q{i}"] = right_a, right_b
            i += 1
    return a, b


def test_paired_em_counts_the_questions_only_one_system_gets_right():
    a, b = _systems(both=100, only_a=40, only_b=52, neither=161)
    r = paired_em(a, b)
    assert (r["n"], r["only_a"], r["only_b"], r["left_out"]) == (353, 40, 52, 0)
    assert r["em_a"] == pytest.approx(100 * 140 / 353, abs=0.05)
    assert r["em_b"] == pytest.approx(100 * 152 / 353, abs=0.05)
    assert r["difference"] == pytest.approx(100 * -12 / 353, abs=0.05)
    assert r["low"] < r["difference"] < r["high"]  # the interval holds the observed difference
    assert r["low"] < 0 < r["high"]  # 12 questions of 353 is within the questions' luck ...
    assert r["p"] > 0.05


def test_paired_em_a_lopsided_split_is_significant_and_its_interval_excludes_zero():
    a, b = _systems(both=100, only_a=5, only_b=40, neither=208)
    r = paired_em(a, b)
    assert r["p"] < 0.001
    assert r["high"] < 0


def test_mcnemar_p_is_the_exact_binomial_test():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(3, 3) == pytest.approx(1.0)
    assert mcnemar_p(0, 5) == pytest.approx(2 * 0.5**5)  # the two-sided tail of 5 of 5
    assert mcnemar_p(1, 9) == pytest.approx(2 * (1 + 10) / 2**10)
    with pytest.raises(ValueError, match=">= 0"):
        mcnemar_p(-1, 2)


def test_paired_em_pairs_by_question_and_counts_the_rest():
    a = {"q1": True, "q2": False, "q3": True}
    b = {"q2": True, "q3": True, "q4": False}
    r = paired_em(a, b)
    assert (r["n"], r["only_a"], r["only_b"], r["left_out"]) == (2, 0, 1, 2)
    with pytest.raises(ValueError, match="share no question"):
        paired_em({"q1": True}, {"q2": True})


def test_intervals_are_reproducible_and_narrow_with_more_questions():
    a, b = _systems(both=30, only_a=10, only_b=20, neither=40)
    assert paired_em(a, b) == paired_em(a, b)  # a fixed seed: the same figures every run
    other = paired_em(a, b, seed=1)
    assert (other["low"], other["high"]) != (paired_em(a, b)["low"], paired_em(a, b)["high"])
    assert other["p"] == paired_em(a, b)["p"]  # the exact test does not resample
    small = em_interval({f"q{i}": i % 3 == 0 for i in range(60)})
    large = em_interval({f"q{i}": i % 3 == 0 for i in range(600)})
    assert small["low"] < small["em"] < small["high"]
    assert large["high"] - large["low"] < small["high"] - small["low"]
    assert em_interval({"q1": True, "q2": True})["low"] == 100.0  # every resample is all right
    with pytest.raises(ValueError, match="no questions"):
        em_interval({})


def test_describe_paired_says_both_scores_the_counts_and_the_p_value():
    a, b = _systems(both=10, only_a=2, only_b=6, neither=12)
    line = describe_paired(paired_em(a, b), "ours", "GPT-3")
    assert line.startswith("ours 40.0 against GPT-3 53.3 (n 30): -13.3 EM, 95% interval ")
    assert "only ours right 2, only GPT-3 right 6, McNemar p 0.29" in line
    a, b = _systems(both=10, only_a=0, only_b=30, neither=10)
    assert describe_paired(paired_em(a, b)).endswith("only A right 0, only B right 30, McNemar p < 0.001")
    a, b = _systems(both=10, only_a=3, only_b=3, neither=10)
    assert describe_paired(paired_em(a, b)).endswith("McNemar p 1")


def test_bounds_never_print_as_minus_zero():
    from evaluation.paired import _points

    assert f"{_points(-1e-12):+.1f}" == "+0.0"  # round(-1e-10, 1) alone is -0.0
    a, b = _systems(both=12, only_a=2, only_b=0, neither=339)  # many resamples hold neither of the two
    r = paired_em(a, b)
    assert r["low"] == 0.0 and "interval +0.0.." in describe_paired(r)
