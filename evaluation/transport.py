"""Transportability (Marshall et al., "Switching Contexts: Transportability Measures for NLP",
IWCS 2021) and a drift-to-drop regression that predicts a quarter's F1 before it is answered.

Here a *domain* is a period of news (a quarter, or a month inside it). For one model/index version
with scores on several periods:

    tau_p(t)   = score(t) / score(source)            (1.0: no change; < 1: worse than on the source)
    tau_p      = mean of tau_p(t) over the periods after the source
    tau_var    = (1 + 1/(4n)) * stdev(scores) / mean(scores)   over the n periods, source included

tau_var is the coefficient of variation with the usual small-sample bias correction
(sample standard deviation, ddof=1); it is NaN for fewer than two periods or a zero mean.

The regression: a drift measure x of a month (how far its news is from the source's, see
evaluation/drift.py) against the drop y = source F1 - the month's F1, fitted by weighted least
squares (weights: questions per month). With few points an intercept is not identifiable, and no
drift should mean no drop, so the default line goes through the origin (y = b x); an intercept is
fitted only when asked and at least three months are known. A quarter's prediction is the source
F1 minus the mean predicted drop over its months (weighted by their questions when known).
`walk_forward` replays this honestly: each quarter is predicted from the months of the quarters
before it only, and the naive "no change" forecast (the previous quarter's F1) is reported beside
it so the regression has something to beat.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


def tau_p(source_score: float, target_score: float) -> float:
    """Performance ratio of a target period to the source; NaN when the source score is 0."""
    return target_score / source_score if source_score else math.nan


def tau_var(scores: Sequence[float]) -> float:
    """Bias-corrected coefficient of variation, (1 + 1/(4n)) * stdev / mean, over n >= 2 scores."""
    values = np.asarray([s for s in scores if s is not None and not math.isnan(s)], dtype=float)
    n = len(values)
    if n < 2 or values.mean() == 0:
        return math.nan
    return float((1 + 1 / (4 * n)) * values.std(ddof=1) / values.mean())


def transportability(scores: Mapping[str, float], source: str) -> dict:
    """tau_p per period, their mean, and tau_var, for one version's scores.

    Args:
        scores: period -> score (e.g. {"2022Q3": 12.1, "2022Q4": 10.4}), periods sortable in time.
        source: the period the version is judged from (its own or its first evaluated period).

    Returns:
        {"source", "source_score", "tau_p": {period: ratio} (periods after the source),
         "tau_p_mean", "tau_var", "n"}.
    """
    if source not in scores:
        raise ValueError(f"source period {source!r} has no score (have {sorted(scores)})")
    base = scores[source]
    later = {p: tau_p(base, s) for p, s in sorted(scores.items()) if p > source}
    ratios = [r for r in later.values() if not math.isnan(r)]
    return {
        "source": source,
        "source_score": base,
        "tau_p": later,
        "tau_p_mean": float(np.mean(ratios)) if ratios else math.nan,
        "tau_var": tau_var(list(scores.values())),
        "n": len(scores),
    }


@dataclass(frozen=True)
class DropModel:
    """drop = intercept + slope * drift, fitted on (drift, drop, weight) points."""

    slope: float
    intercept: float = 0.0
    n_points: int = 0

    def predict(self, drift: float) -> float:
        return self.intercept + self.slope * drift


def fit_drop_model(
    drifts: Sequence[float], drops: Sequence[float], weights: Sequence[float] | None = None, *, intercept: bool = False
) -> DropModel:
    """Weighted least squares of drop on drift; through the origin unless `intercept` (and >= 3 points).

    Returns:
        The fitted model; slope 0 (predict no drop) when there are no points or no drift at all.
    """
    x = np.asarray(drifts, dtype=float)
    y = np.asarray(drops, dtype=float)
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=float)
    if len(x) != len(y) or len(x) != len(w):
        raise ValueError(f"drifts, drops and weights differ in length ({len(x)}, {len(y)}, {len(w)})")
    keep = ~(np.isnan(x) | np.isnan(y)) & (w > 0)
    x, y, w = x[keep], y[keep], w[keep]
    if len(x) == 0 or not np.any(x):
        return DropModel(0.0, 0.0, int(len(x)))
    if intercept and len(x) >= 3 and np.ptp(x) > 0:
        design = np.stack([np.ones_like(x), x], axis=1) * np.sqrt(w)[:, None]  # (n, 2)
        (a, b), *_ = np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)
        return DropModel(float(b), float(a), int(len(x)))
    return DropModel(float(np.sum(w * x * y) / np.sum(w * x * x)), 0.0, int(len(x)))


@dataclass(frozen=True)
class PeriodScore:
    """One month's measured score and its drift from the source."""

    month: str  # "YYYY-MM"
    quarter: str  # "YYYYQn"
    drift: float
    f1: float | None  # None: not answered yet (the quarter to predict)
    n: int  # questions behind f1 (0 when unknown)


def predict_quarter(source_f1: float, model: DropModel, months: Sequence[PeriodScore]) -> float:
    """Source F1 minus the mean predicted drop over a quarter's months (weighted by questions when known)."""
    if not months:
        raise ValueError("a quarter to predict needs at least one month with a drift")
    weights = np.asarray([m.n for m in months], dtype=float)
    if weights.sum() <= 0:
        weights = np.ones(len(months))
    drops = np.asarray([model.predict(m.drift) for m in months])
    return float(source_f1 - np.sum(weights * drops) / weights.sum())


def quarter_f1(months: Sequence[PeriodScore]) -> float | None:
    """Question-weighted F1 of a quarter's answered months."""
    done = [m for m in months if m.f1 is not None and m.n > 0]
    if not done:
        return None
    return float(sum(m.f1 * m.n for m in done) / sum(m.n for m in done))


def walk_forward(months: Sequence[PeriodScore], source_quarter: str, *, intercept: bool = False) -> list[dict]:
    """Predict every quarter after the source from the months of earlier quarters only.

    Args:
        months: every month with a drift (from the source quarter on); f1 None where unanswered.
        source_quarter: the quarter whose F1 is the reference (its months have drift ~0 or small).

    Returns:
        One row per quarter after the source: {"quarter", "drift" (question-weighted mean),
        "predicted_f1", "actual_f1" (None if not answered), "error" (predicted - actual),
        "naive_f1" (previous quarter's F1), "naive_error", "slope", "intercept", "n_points"}.
    """
    by_quarter: dict[str, list[PeriodScore]] = {}
    for m in sorted(months, key=lambda m: m.month):
        by_quarter.setdefault(m.quarter, []).append(m)
    if source_quarter not in by_quarter:
        raise ValueError(f"the source quarter {source_quarter} has no months")
    source_f1 = quarter_f1(by_quarter[source_quarter])
    if source_f1 is None:
        raise ValueError(f"the source quarter {source_quarter} has no answered questions")
    rows, previous = [], source_f1
    quarters = sorted(q for q in by_quarter if q > source_quarter)
    for q in quarters:
        known = [m for p in by_quarter if p < q for m in by_quarter[p] if m.f1 is not None and m.n > 0]
        model = fit_drop_model(
            [m.drift for m in known], [source_f1 - m.f1 for m in known], [m.n for m in known], intercept=intercept
        )
        predicted = predict_quarter(source_f1, model, by_quarter[q])
        actual = quarter_f1(by_quarter[q])
        weights = [max(m.n, 1) for m in by_quarter[q]]
        drift = float(np.average([m.drift for m in by_quarter[q]], weights=weights))
        rows.append(
            {
                "quarter": q,
                "drift": drift,
                "predicted_f1": predicted,
                "actual_f1": actual,
                "error": None if actual is None else predicted - actual,
                "naive_f1": previous,
                "naive_error": None if actual is None else previous - actual,
                "slope": model.slope,
                "intercept": model.intercept,
                "n_points": model.n_points,
            }
        )
        if actual is not None:
            previous = actual
    return rows
