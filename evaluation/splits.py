"""Split strategies for estimating performance from a pool of questions (Søgaard et al., "We Need
to Talk About Random Splits", EACL 2021), and the estimate each one gives.

Strategies, each a list of (train, test) index splits over the pool:
- random: k seeded random splits, `test_fraction` of the pool held out each time;
- length: the heuristic split, the longest `test_fraction` of the questions held out (one split);
- adversarial: k times, a random pool question is the centroid and its nearest neighbours in
  embedding space (cosine) form the test set, the rest trains: the test set is as far from the
  training data as one cluster can be;
- temporal: the whole pool trains and a *new sample* (a later quarter) tests: the truth the
  other strategies try to estimate.

For every split a learner is trained on the train part and scored on the test part, and so is a
trivial baseline; the error reduction over the baseline is (learner - baseline) / (100 - baseline)
in F1 points. `summarise` gives the estimate (mean over the strategy's splits), its spread (sample
standard deviation, min and max) and the difference from the temporal estimate, as in the paper's
Table 2. Pure functions: the learner and the scoring come from the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

STRATEGIES = ("random", "length", "adversarial", "temporal")


@dataclass(frozen=True)
class Split:
    strategy: str
    repeat: int
    train: np.ndarray  # (n_train,) indices into the pool
    test: np.ndarray  # (n_test,) indices into the pool, or into the new sample for "temporal"


def _test_size(n: int, test_fraction: float) -> int:
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be between 0 and 1, got {test_fraction}")
    if n < 2:
        raise ValueError(f"a pool of {n} question(s) cannot be split")
    return min(n - 1, max(1, round(n * test_fraction)))


def random_splits(n: int, *, k: int = 5, test_fraction: float = 0.1, seed: int = 0) -> list[Split]:
    """k seeded random splits of a pool of n."""
    size = _test_size(n, test_fraction)
    rng = np.random.default_rng(seed)
    out = []
    for r in range(k):
        order = rng.permutation(n)
        out.append(Split("random", r, np.sort(order[size:]), np.sort(order[:size])))
    return out


def length_split(lengths: Sequence[int], *, test_fraction: float = 0.1) -> list[Split]:
    """The longest test_fraction of the pool held out (ties broken by position, so it is deterministic)."""
    n = len(lengths)
    size = _test_size(n, test_fraction)
    order = np.argsort(-np.asarray(lengths), kind="stable")
    return [Split("length", 0, np.sort(order[size:]), np.sort(order[:size]))]


def adversarial_splits(embeddings: np.ndarray, *, k: int = 5, test_fraction: float = 0.1, seed: int = 0) -> list[Split]:
    """k splits whose test set is a random centroid's nearest neighbours.

    Args:
        embeddings: (n, dim) question embeddings; rows are L2-normalised here.
    """
    x = np.asarray(embeddings, dtype=np.float32)
    n = len(x)
    size = _test_size(n, test_fraction)
    x = x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    rng = np.random.default_rng(seed)
    centres = rng.choice(n, size=min(k, n), replace=False)
    out = []
    for r, c in enumerate(centres):
        order = np.argsort(-(x @ x[c]), kind="stable")  # nearest first; the centre itself is first
        out.append(Split("adversarial", r, np.sort(order[size:]), np.sort(order[:size])))
    return out


def temporal_split(n_pool: int, n_new: int) -> list[Split]:
    """Train on the whole pool, test on the new sample (indices into the new sample)."""
    if n_pool < 1 or n_new < 1:
        raise ValueError(f"a temporal split needs a pool and a new sample (got {n_pool} and {n_new} questions)")
    return [Split("temporal", 0, np.arange(n_pool), np.arange(n_new))]


def error_reduction(score: float, baseline: float, best: float = 100.0) -> float:
    """Share of the baseline's error the learner removes: (score - baseline) / (best - baseline)."""
    return (score - baseline) / (best - baseline) if best != baseline else math.nan


@dataclass(frozen=True)
class SplitScore:
    strategy: str
    repeat: int
    n_train: int
    n_test: int
    score: float  # the learner's metric on the test part
    baseline: float  # the trivial baseline's on the same test part


def run_splits(splits: Sequence[Split], evaluate: Callable[[Split], tuple[float, float]]) -> list[SplitScore]:
    """Score every split with `evaluate(split) -> (learner score, baseline score)`."""
    out = []
    for s in splits:
        score, base = evaluate(s)
        out.append(SplitScore(s.strategy, s.repeat, len(s.train), len(s.test), float(score), float(base)))
    return out


def summarise(scores: Sequence[SplitScore]) -> list[dict]:
    """One row per strategy: estimate, spread, baseline, error reduction and difference from temporal.

    Returns:
        [{"strategy", "splits", "n_test", "estimate", "std", "min", "max", "baseline",
          "error_reduction", "diff_from_temporal"}] in STRATEGIES order; diff is NaN without a
          temporal row.
    """
    rows = []
    for strategy in STRATEGIES:
        mine = [s for s in scores if s.strategy == strategy]
        if not mine:
            continue
        values = np.array([s.score for s in mine])
        base = float(np.mean([s.baseline for s in mine]))
        estimate = float(values.mean())
        rows.append(
            {
                "strategy": strategy,
                "splits": len(mine),
                "n_test": int(np.mean([s.n_test for s in mine])),
                "estimate": estimate,
                "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
                "min": float(values.min()),
                "max": float(values.max()),
                "baseline": base,
                "error_reduction": error_reduction(estimate, base),
            }
        )
    truth = next((r["estimate"] for r in rows if r["strategy"] == "temporal"), math.nan)
    for r in rows:
        r["diff_from_temporal"] = r["estimate"] - truth
    return rows
