"""Split strategies (random, length, adversarial, temporal) and their summary table."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.splits import (
    SplitScore,
    adversarial_splits,
    error_reduction,
    length_split,
    random_splits,
    run_splits,
    summarise,
    temporal_split,
)


def test_random_splits_partition_the_pool_and_differ_between_repeats():
    splits = random_splits(50, k=3, test_fraction=0.2, seed=1)
    assert len(splits) == 3
    for s in splits:
        assert len(s.test) == 10 and len(s.train) == 40
        assert sorted(np.concatenate([s.train, s.test]).tolist()) == list(range(50))
    assert not np.array_equal(splits[0].test, splits[1].test)
    assert np.array_equal(random_splits(50, k=1, seed=1)[0].test, random_splits(50, k=1, seed=1)[0].test)


def test_length_split_holds_out_the_longest():
    lengths = [5, 30, 7, 25, 6, 8, 9, 10, 11, 12]
    (s,) = length_split(lengths, test_fraction=0.2)
    assert s.test.tolist() == [1, 3]
    assert 1 not in s.train and len(s.train) == 8


def test_adversarial_split_takes_one_cluster_as_the_test_set():
    rng = np.random.default_rng(0)
    a = rng.normal(0, 0.01, (20, 4)) + np.array([1, 0, 0, 0])
    b = rng.normal(0, 0.01, (20, 4)) + np.array([0, 1, 0, 0])
    splits = adversarial_splits(np.vstack([a, b]), k=4, test_fraction=0.25, seed=3)
    for s in splits:
        assert len(s.test) == 10
        in_a = (s.test < 20).sum()
        assert in_a in (0, 10)  # all from one cluster, never a mix
        assert set(s.train.tolist()).isdisjoint(s.test.tolist())


def test_temporal_split_trains_on_the_whole_pool():
    (s,) = temporal_split(30, 7)
    assert len(s.train) == 30 and s.test.tolist() == list(range(7))
    with pytest.raises(ValueError, match="new sample"):
        temporal_split(30, 0)


def test_bad_fractions_and_tiny_pools_are_refused():
    with pytest.raises(ValueError, match="test_fraction"):
        random_splits(10, test_fraction=1.5)
    with pytest.raises(ValueError, match="cannot be split"):
        length_split([3])


def test_summarise_reports_estimate_spread_error_reduction_and_difference_from_temporal():
    scores = run_splits(
        random_splits(20, k=2) + temporal_split(20, 5),
        lambda s: (30.0 + s.repeat * 10 if s.strategy == "random" else 20.0, 10.0),
    )
    rows = {r["strategy"]: r for r in summarise(scores)}
    assert rows["random"]["estimate"] == pytest.approx(35.0)
    assert rows["random"]["std"] == pytest.approx(np.std([30, 40], ddof=1))
    assert rows["random"]["diff_from_temporal"] == pytest.approx(15.0)
    assert rows["temporal"]["diff_from_temporal"] == 0.0
    assert rows["random"]["error_reduction"] == pytest.approx(25 / 90)
    alone = summarise([SplitScore("length", 0, 9, 1, 50.0, 0.0)])
    assert math.isnan(alone[0]["diff_from_temporal"])
    assert math.isnan(error_reduction(100.0, 100.0))
