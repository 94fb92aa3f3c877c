"""Transportability (tau_p, tau_var) and the drift-to-drop regression."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evaluation.transport import (
    DropModel,
    PeriodScore,
    fit_drop_model,
    predict_quarter,
    tau_p,
    tau_var,
    transportability,
    walk_forward,
)


def test_tau_p_is_the_ratio_to_the_source_and_nan_for_a_zero_source():
    assert tau_p(20.0, 15.0) == pytest.approx(0.75)
    assert math.isnan(tau_p(0.0, 5.0))


def test_tau_var_applies_the_small_sample_correction():
    scores = [10.0, 12.0, 14.0]
    cv = np.std(scores, ddof=1) / np.mean(scores)  # 2 / 12
    assert tau_var(scores) == pytest.approx((1 + 1 / 12) * cv)
    assert math.isnan(tau_var([10.0]))
    assert math.isnan(tau_var([0.0, 0.0]))


def test_transportability_uses_later_periods_only():
    out = transportability({"2022Q3": 20.0, "2022Q4": 10.0, "2023Q1": 15.0}, "2022Q4")
    assert out["tau_p"] == {"2023Q1": pytest.approx(1.5)}
    assert out["tau_p_mean"] == pytest.approx(1.5)
    assert out["n"] == 3
    with pytest.raises(ValueError, match="no score"):
        transportability({"2022Q3": 1.0}, "2023Q1")


def test_fit_drop_model_through_the_origin_recovers_the_slope():
    model = fit_drop_model([0.1, 0.2, 0.4], [1.0, 2.0, 4.0])
    assert model.slope == pytest.approx(10.0)
    assert model.intercept == 0.0
    assert model.predict(0.3) == pytest.approx(3.0)


def test_fit_drop_model_with_intercept_needs_three_points():
    two = fit_drop_model([0.1, 0.2], [3.0, 4.0], intercept=True)
    assert two.intercept == 0.0  # too few points: through the origin
    three = fit_drop_model([0.1, 0.2, 0.3], [3.0, 4.0, 5.0], intercept=True)
    assert three.slope == pytest.approx(10.0) and three.intercept == pytest.approx(2.0)


def test_fit_drop_model_without_drift_predicts_no_drop():
    assert fit_drop_model([], []).predict(1.0) == 0.0
    assert fit_drop_model([0.0, 0.0], [5.0, 3.0]).predict(1.0) == 0.0
    with pytest.raises(ValueError, match="differ in length"):
        fit_drop_model([0.1], [1.0, 2.0])


def test_predict_quarter_weights_months_by_questions():
    model = DropModel(slope=10.0)
    months = [PeriodScore("2023-01", "2023Q1", 0.1, None, 3), PeriodScore("2023-02", "2023Q1", 0.4, None, 1)]
    assert predict_quarter(20.0, model, months) == pytest.approx(20.0 - (3 * 1.0 + 1 * 4.0) / 4)


def _months(f1_by_month: dict[str, float | None], drift: dict[str, float]) -> list[PeriodScore]:
    quarter = {
        "01": "Q1",
        "02": "Q1",
        "03": "Q1",
        "04": "Q2",
        "05": "Q2",
        "06": "Q2",
        "07": "Q3",
        "08": "Q3",
        "09": "Q3",
    }
    return [
        PeriodScore(m, m[:4] + quarter[m[5:]], drift[m], f1, 10 if f1 is not None else 0)
        for m, f1 in f1_by_month.items()
    ]


def test_walk_forward_predicts_each_quarter_from_earlier_quarters_only():
    drift = {
        "2023-01": 0.0,
        "2023-02": 0.0,
        "2023-03": 0.0,
        "2023-04": 0.1,
        "2023-05": 0.1,
        "2023-06": 0.1,
        "2023-07": 0.2,
        "2023-08": 0.2,
        "2023-09": 0.2,
    }
    f1 = {
        "2023-01": 20.0,
        "2023-02": 20.0,
        "2023-03": 20.0,
        "2023-04": 18.0,
        "2023-05": 18.0,
        "2023-06": 18.0,
        "2023-07": 16.0,
        "2023-08": 16.0,
        "2023-09": None,
    }
    rows = walk_forward(_months(f1, drift), "2023Q1")
    assert [r["quarter"] for r in rows] == ["2023Q2", "2023Q3"]
    # Q2 is predicted from Q1's months only, whose drift is 0: no drop predicted.
    assert rows[0]["predicted_f1"] == pytest.approx(20.0) and rows[0]["actual_f1"] == pytest.approx(18.0)
    assert rows[0]["naive_f1"] == pytest.approx(20.0)
    # Q3 learns slope 20 from Q2 (drop 2 at drift 0.1): drift 0.2 -> drop 4.
    assert rows[1]["predicted_f1"] == pytest.approx(16.0)
    assert rows[1]["actual_f1"] == pytest.approx(16.0)  # two answered months
    assert rows[1]["naive_f1"] == pytest.approx(18.0)
    # Changing a later quarter's score never changes an earlier prediction.
    f1["2023-08"] = 0.0
    again = walk_forward(_months(f1, drift), "2023Q1")
    assert again[0]["predicted_f1"] == rows[0]["predicted_f1"]
    assert again[1]["predicted_f1"] == rows[1]["predicted_f1"]


def test_walk_forward_refuses_a_source_without_scores():
    months = [PeriodScore("2023-01", "2023Q1", 0.0, None, 0), PeriodScore("2023-04", "2023Q2", 0.1, 5.0, 3)]
    with pytest.raises(ValueError, match="no answered questions"):
        walk_forward(months, "2023Q1")
    with pytest.raises(ValueError, match="has no months"):
        walk_forward(months, "2022Q4")
