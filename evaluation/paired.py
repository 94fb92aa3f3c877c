"""Two systems on the same questions: how many each gets right that the other does not, and whether
the difference is more than the questions' luck.

A benchmark of a few hundred questions moves by a question or two between runs, and one question is
0.3 EM points of 353: "32.0 against 35.1" says little until it says how many questions flipped each
way. `paired_em` gives the discordant counts, the exact McNemar test on them (a two-sided binomial
test of the questions only one system gets right) and a paired bootstrap interval of the EM
difference; `em_interval` the bootstrap interval of one system's EM. The p-value is the test. The
percentile bootstrap interval is approximate, and narrow when few questions are discordant: with 5
against 0 of 131 it excludes zero (a resample misses all five less than 2.5% of the time) while p is
0.06. Used by
`bench/bench_quality.py` (against a published system) and `bench/compare_quality.py` (two runs).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from evaluation.metrics import exact_match

__all__ = ["correct", "paired_em", "em_interval", "describe_paired"]

BOOTSTRAP_ROUNDS = 10_000
LEVEL = 0.95


def correct(prediction: str | None, answers) -> bool:
    """Whether `prediction` matches a gold answer exactly; no prediction is wrong (as
    `evaluation.bakeoff.score` counts it)."""
    return prediction is not None and exact_match(prediction, list(answers)) == 1.0


def _bootstrap_means(values: np.ndarray, rounds: int, seed: int) -> np.ndarray:
    """`rounds` means of `values` resampled with replacement (a fixed seed: the same figures every run)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, values.size, size=(rounds, values.size))
    return values[idx].mean(axis=1)


def _points(fraction: float) -> float:
    """A fraction as EM points, one decimal (+ 0.0: a bound that rounds from a tiny negative prints
    0.0, not -0.0)."""
    return round(100 * fraction, 1) + 0.0


def _interval(means: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1 - level) / 2
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return _points(float(lo)), _points(float(hi))


def em_interval(
    right: Mapping[str, bool], *, rounds: int = BOOTSTRAP_ROUNDS, level: float = LEVEL, seed: int = 0
) -> dict:
    """One system's EM (points) with a percentile bootstrap interval over its questions.

    Example:
        >>> em_interval({"a": True, "b": False, "c": False, "d": True})["em"]
        50.0
    """
    if not right:
        raise ValueError("no questions to score")
    x = np.fromiter((bool(v) for v in right.values()), dtype=float)
    lo, hi = _interval(_bootstrap_means(x, rounds, seed), level)
    return {"n": int(x.size), "em": _points(float(x.mean())), "low": lo, "high": hi, "level": level}


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value: of the `only_a + only_b` questions exactly one system gets
    right, is the split further from even than chance makes it? 1.0 when none are discordant."""
    if only_a < 0 or only_b < 0:
        raise ValueError(f"counts must be >= 0, got {only_a} and {only_b}")
    if only_a + only_b == 0:
        return 1.0
    from scipy.stats import binomtest  # noqa: PLC0415 (lazy: scipy.stats, ~0.6 s to import)

    return float(binomtest(only_a, only_a + only_b, 0.5, alternative="two-sided").pvalue)


def paired_em(
    a: Mapping[str, bool], b: Mapping[str, bool], *, rounds: int = BOOTSTRAP_ROUNDS, level: float = LEVEL, seed: int = 0
) -> dict:
    """System A against system B on the questions both were scored on (right or wrong each).

    Returns:
        {"n", "em_a", "em_b", "difference" (A - B, EM points), "only_a", "only_b" (questions only
        that system gets right), "p" (exact McNemar), "low", "high" (paired bootstrap interval of
        the difference), "level"}. Questions only one side has are left out, and counted in
        "left_out".

    Example:
        >>> r = paired_em({"q1": True, "q2": True, "q3": False}, {"q1": True, "q2": False, "q3": False})
        >>> r["difference"], r["only_a"], r["only_b"]
        (33.3, 1, 0)
    """
    common = [qid for qid in a if qid in b]
    if not common:
        raise ValueError("the two systems share no question")
    xa = np.fromiter((bool(a[q]) for q in common), dtype=float)
    xb = np.fromiter((bool(b[q]) for q in common), dtype=float)
    only_a, only_b = int(((xa == 1) & (xb == 0)).sum()), int(((xa == 0) & (xb == 1)).sum())
    lo, hi = _interval(_bootstrap_means(xa - xb, rounds, seed), level)
    return {
        "n": len(common),
        "em_a": _points(float(xa.mean())),
        "em_b": _points(float(xb.mean())),
        "difference": _points(float((xa - xb).mean())),
        "only_a": only_a,
        "only_b": only_b,
        "p": round(mcnemar_p(only_a, only_b), 4),
        "low": lo,
        "high": hi,
        "level": level,
        "left_out": len(set(a) ^ set(b)),
    }


def describe_paired(r: dict, a: str = "A", b: str = "B") -> str:
    """One line: "A 31.7 against B 35.1 (n 353): -3.4 EM, 95% interval -7.4..+0.6; only A right 40,
    only B right 52, McNemar p 0.25"."""
    pct = round(100 * r["level"])
    p = r["p"]
    p_text = "1" if p >= 1 else f"{p:.2g}" if p >= 0.001 else "< 0.001"
    return (
        f"{a} {r['em_a']:.1f} against {b} {r['em_b']:.1f} (n {r['n']}): {r['difference']:+.1f} EM, "
        f"{pct}% interval {r['low']:+.1f}..{r['high']:+.1f}; only {a} right {r['only_a']}, "
        f"only {b} right {r['only_b']}, McNemar p {p_text}"
    )
