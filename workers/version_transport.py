"""Transportability of each reader/index version over the quarters it was evaluated on, and the
drift regression that predicts the next quarter's F1 before any of its questions is answered.

Scores come from stored evaluation results (quarterly runs and replays): a question counts once per
version, answered by a state at least as new as its quarter (the index serves only what was
published by the question's date, so every such state gives the same answer for index-only
updates). Drift comes from the month profiles written at ingest (workers/month_drift.py): each month
against the months of the version's source quarter (its first evaluated quarter).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from evaluation.drift import MonthProfile, drift_between
from evaluation.temporal import quarter_bounds, quarter_index, quarter_of
from evaluation.transport import PeriodScore, fit_drop_model, quarter_f1, transportability, walk_forward
from store.tables import EvalResult, EvalRun, Question
from workers.config import DEFAULT_MEASURE, TransportConfig
from workers.month_drift import ProfileStore

log = logging.getLogger(__name__)

ProfileLoader = Callable[[str], "MonthProfile | None"]  # "YYYY-MM" -> its profile, None if missing


@dataclass(frozen=True)
class MonthScores:
    f1_sum: float = 0.0  # in points (0..100)
    n: int = 0


def version_key(params: dict) -> str:
    """A reader/index version as evaluation runs record it: "<reader> @ <encoder>"."""
    return f"{params.get('reader', '?')} @ {params.get('encoder', '?')}"


def month_scores(session: Session) -> dict[str, dict[str, MonthScores]]:
    """{version: {"YYYY-MM": F1 sum and count}} from every evaluated question (lag >= 0, read by the reader)."""
    rows = session.execute(
        select(
            EvalRun.params,
            EvalResult.question_id,
            EvalResult.f1,
            EvalResult.test_quarter,
            EvalResult.state_quarter,
            Question.asked,
        )
        .join(EvalRun, EvalRun.id == EvalResult.run_id)
        .join(Question, Question.id == EvalResult.question_id)
        .where(EvalResult.f1.is_not(None))
        .order_by(EvalResult.id)
    ).all()
    seen: set[tuple[str, int]] = set()
    out: dict[str, dict[str, list[float]]] = {}
    for params, qid, f1, test_q, state_q, asked in rows:
        if quarter_index(state_q) < quarter_index(test_q):
            continue  # an older index than the question's quarter: deterioration, not this model's level
        key = version_key(params or {})
        if (key, qid) in seen:
            continue
        seen.add((key, qid))
        out.setdefault(key, {}).setdefault(asked.strftime("%Y-%m"), []).append(100.0 * f1)
    return {k: {m: MonthScores(sum(v), len(v)) for m, v in months.items()} for k, months in out.items()}


def _months_of(quarter: str) -> list[str]:
    """ "2023Q2" -> ["2023-04", "2023-05", "2023-06"] (ValueError for a malformed quarter)."""
    first, _ = quarter_bounds(quarter)
    return [f"{first.year}-{first.month + i:02d}" for i in range(3)]


def transport_summary(
    scores: dict[str, MonthScores],
    load: ProfileLoader,
    *,
    measure: str = DEFAULT_MEASURE,
    source: str | None = None,
    extra_months: list[str] | None = None,
) -> dict:
    """Transportability, per-month drift and walk-forward predictions for one version.

    Args:
        scores: that version's month -> MonthScores.
        load: month -> profile (None where the month has none).
        source: the source quarter (default: the first quarter with scores).
        extra_months: months with a profile but no scores yet (the quarter to predict).

    Returns:
        {"source", "measure", "quarters": {q: {"f1", "n"}}, "transport": {...}, "months": [...],
         "predictions": walk_forward rows, "mean_abs_error", "naive_mean_abs_error"}.
    """
    if not scores:
        raise ValueError("no evaluated questions for this version: run `sqa evaluate --quarter ...` first")
    quarters = sorted({quarter_of(m + "-01") for m in scores}, key=quarter_index)
    source = source or quarters[0]
    source_profiles = [p for p in (load(m) for m in _months_of(source)) if p is not None]
    if not source_profiles:
        raise ValueError(
            f"no drift profile for the months of the source quarter {source}: run `sqa drift --from "
            f"{_months_of(source)[0]} --to {_months_of(source)[-1]}`"
        )
    source_profile = MonthProfile.merge(source_profiles)
    months = sorted(set(scores) | set(extra_months or []))
    periods, missing = [], []
    for m in months:
        quarter = quarter_of(m + "-01")
        if quarter_index(quarter) < quarter_index(source):
            continue
        profile = load(m)
        if profile is None:
            missing.append(m)
            continue
        drift = drift_between(profile, source_profile)
        if measure not in drift:
            raise ValueError(f"drift measure {measure!r} is not available (have {', '.join(drift)})")
        s = scores.get(m, MonthScores())
        periods.append((PeriodScore(m, quarter, drift[measure], s.f1_sum / s.n if s.n else None, s.n), drift))
    by_quarter: dict[str, list[PeriodScore]] = {}
    for p, _ in periods:
        by_quarter.setdefault(p.quarter, []).append(p)
    quarter_scores = {q: quarter_f1(ps) for q, ps in by_quarter.items()}
    answered = {q: f for q, f in quarter_scores.items() if f is not None}
    predictions = walk_forward([p for p, _ in periods], source)
    errors = [abs(r["error"]) for r in predictions if r["error"] is not None]
    naive = [abs(r["naive_error"]) for r in predictions if r["naive_error"] is not None]
    return {
        "source": source,
        "measure": measure,
        "source_months": list(source_profile.months),
        "quarters": {q: {"f1": quarter_scores[q], "n": sum(p.n for p in ps)} for q, ps in sorted(by_quarter.items())},
        "transport": transportability(answered, source),
        "months": [{"month": p.month, "quarter": p.quarter, "f1": p.f1, "n": p.n, **d} for p, d in periods],
        "missing_profiles": missing,
        "predictions": predictions,
        "mean_abs_error": sum(errors) / len(errors) if errors else None,
        "naive_mean_abs_error": sum(naive) / len(naive) if naive else None,
    }


def predicted_drop(
    scores: dict[str, MonthScores], load: ProfileLoader, month: str, *, measure: str = DEFAULT_MEASURE
) -> dict:
    """The F1 drop the regression expects for a newly ingested month (for SQA_FINETUNE_POLICY=on-drift).

    Returns:
        {"month", "drift", "predicted_drop", "predicted_f1", "source", "source_f1", "n_points"}.
    """
    summary = transport_summary(scores, load, measure=measure, extra_months=[month])
    target = next((m for m in summary["months"] if m["month"] == month), None)
    if target is None:
        raise ValueError(f"month {month} has no drift profile (is it ingested?)")
    source_f1 = summary["quarters"][summary["source"]]["f1"]
    known = [m for m in summary["months"] if m["f1"] is not None and m["n"] > 0 and m["month"] < month]
    model = fit_drop_model([m[measure] for m in known], [source_f1 - m["f1"] for m in known], [m["n"] for m in known])
    drop = model.predict(target[measure])
    return {
        "month": month,
        "drift": target[measure],
        "measure": measure,
        "predicted_drop": drop,
        "predicted_f1": source_f1 - drop,
        "source": summary["source"],
        "source_f1": source_f1,
        "n_points": model.n_points,
    }


def profile_loader(session: Session, cfg: TransportConfig) -> ProfileLoader:
    """Month -> profile of the serving snapshot's month shards (built and saved on first use, with
    the configured feature kinds), None for a month that is not ingested."""
    store = ProfileStore(session, cfg.index_dir, cfg.profiles_dir, cfg.features)
    return lambda month: store.get(month) if month in store.months else None


def version_transport(session: Session, params: dict, cfg: TransportConfig) -> dict | None:
    """transport_summary of the version an evaluation run's params name; None if it has no scores."""
    key = version_key(params)
    scores = month_scores(session).get(key)
    if not scores:
        return None
    return {"version": key, **transport_summary(scores, profile_loader(session, cfg), measure=cfg.measure)}
