"""The temporal grid on a hand-made example whose DS, AS, lags and corners are computed here."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime

import numpy as np
import pytest
from scipy.stats import wilcoxon

from evaluation.temporal import TemporalGrid, quarter_index, quarter_of, quarter_range, wilcoxon_method, wilcoxon_p

Q1, Q2, Q3 = "2022Q1", "2022Q2", "2022Q3"

# (state, test) -> F1 of the recent question "a<test>" and the past question "b<test>".
# Cells (mean of the two):      test Q1   Q2    Q3
#                  state Q1      0.75    0.25  0.00
#                  state Q2      1.00    0.75  0.25     (Q2 on Q1 is lag +1: outside the triangle)
#                  state Q3       -       -    0.75
SCORES = {
    (Q1, Q1): (1.0, 0.5),
    (Q2, Q1): (1.0, 1.0),
    (Q1, Q2): (0.0, 0.5),
    (Q2, Q2): (1.0, 0.5),
    (Q1, Q3): (0.0, 0.0),
    (Q2, Q3): (0.5, 0.0),
    (Q3, Q3): (1.0, 0.5),
}


def _rows(scores=SCORES):
    rows = []
    for (state, test), (recent, past) in scores.items():
        for name, subset, f1 in (("a", "recent", recent), ("b", "past", past)):
            rows.append(
                {
                    "question_id": f"{name}{test}",
                    "test_quarter": test,
                    "state_quarter": state,
                    "subset": subset,
                    "metrics": {"f1": f1, "em": float(f1 == 1.0)},
                }
            )
    return rows


@pytest.fixture()
def grid() -> TemporalGrid:
    return TemporalGrid.from_results(_rows())


def test_quarter_helpers_round_trip():
    assert quarter_of(date(2023, 2, 14)) == "2023Q1"
    assert quarter_of("2022-12-31") == "2022Q4"
    assert quarter_of(datetime(2022, 7, 1, tzinfo=UTC)) == "2022Q3"
    assert quarter_range("2022Q3", "2023Q2") == ["2022Q3", "2022Q4", "2023Q1", "2023Q2"]
    assert quarter_index("2023Q1") - quarter_index("2022Q3") == 2
    with pytest.raises(ValueError, match="YYYYQn"):
        quarter_index("2022-Q3")
    with pytest.raises(ValueError, match="empty"):
        quarter_range("2023Q1", "2022Q4")


def test_grid_cell_and_matrix_hand_values(grid):
    assert grid.cell(Q1, Q1) == pytest.approx(0.75)
    assert grid.cell(Q1, Q1, subset="past") == pytest.approx(0.5)
    assert grid.cell(Q3, Q1) is None
    assert grid.cell(Q1, Q1, metric="em") == pytest.approx(0.5)
    states, tests, values = grid.matrix("f1")
    assert states == tests == [Q1, Q2, Q3]
    expected = np.array([[0.75, 0.25, 0.0], [1.0, 0.75, 0.25], [np.nan, np.nan, 0.75]])
    np.testing.assert_allclose(values, expected)


def test_grid_lag_table_pooled_over_questions(grid):
    # lag 0: 1, .5 three times; lag -1: (Q1,Q2) 0, .5 and (Q2,Q3) .5, 0; lag -2: 0, 0; lag +1: 1, 1
    assert grid.lag_table("f1") == pytest.approx({-2: 0.0, -1: 0.25, 0: 0.75, 1: 1.0})
    assert list(grid.lag_table("f1")) == [-2, -1, 0, 1]
    assert grid.lag_table("f1", "recent") == pytest.approx({-2: 0.0, -1: 0.25, 0: 1.0, 1: 1.0})
    assert grid.lag_table("f1", "past") == pytest.approx({-2: 0.0, -1: 0.25, 0: 0.5, 1: 1.0})


def test_grid_deterioration_hand_computed(grid):
    # Row Q1: (Q1->Q2) -0.5/1, (Q1->Q3) -0.75/2, (Q2->Q3) -0.25/1; row Q2: (Q2->Q3) -0.5/1.
    # Row Q2's cell on Q1 is lag +1 and stays out; row Q3 has one cell only.
    diffs = [-0.5, -0.375, -0.25, -0.5]
    result = grid.deterioration("f1")
    assert result["score"] == pytest.approx(sum(diffs) / 4) == pytest.approx(-0.40625)
    assert result["n_pairs"] == 4
    assert result["p_value"] == pytest.approx(wilcoxon(diffs, method="asymptotic").pvalue)  # tied differences
    assert 0.0 <= result["p_value"] <= 1.0


def test_grid_adaptation_hand_computed_with_question_pairs(grid):
    # Column Q2: (Q1->Q2) 0.5; column Q3: (Q1->Q2) 0.25, (Q1->Q3) 0.75/2, (Q2->Q3) 0.5.
    cell_diffs = [0.5, 0.25, 0.375, 0.5]
    # Per question (a then b), each divided by the state gap in quarters.
    paired = [1.0, 0.0, 0.5, 0.0, 0.5, 0.25, 0.5, 0.5]
    result = grid.adaptation("f1")
    assert result["score"] == pytest.approx(sum(cell_diffs) / 4) == pytest.approx(0.40625)
    assert result["n_cell_pairs"] == 4
    assert result["n_pairs"] == 8
    assert result["p_value"] == pytest.approx(wilcoxon(paired, method="asymptotic").pvalue)  # ties and zeros
    assert 0.0 <= result["p_value"] <= 1.0


def test_grid_corners_of_lower_triangle(grid):
    corners = grid.corners("f1")
    assert corners["old_state_old_test"] == {"state": Q1, "test": Q1, "value": pytest.approx(0.75)}
    assert corners["old_state_new_test"] == {"state": Q1, "test": Q3, "value": pytest.approx(0.0)}
    assert corners["new_state_new_test"] == {"state": Q3, "test": Q3, "value": pytest.approx(0.75)}


def test_wilcoxon_method_exact_only_without_ties_or_zeros():
    assert wilcoxon_method(np.array([0.1, -0.2, 0.3])) == "exact"
    assert wilcoxon_method(np.array([0.1, -0.1, 0.3])) == "asymptotic"  # |0.1| twice: a tie
    assert wilcoxon_method(np.array([0.1, 0.0, 0.3])) == "asymptotic"
    assert wilcoxon_method(np.arange(1.0, 52.0)) == "asymptotic"  # over 50
    assert wilcoxon_p([0.1, -0.2, 0.3, 0.4]) == pytest.approx(wilcoxon([0.1, -0.2, 0.3, 0.4], method="exact").pvalue)


def test_wilcoxon_p_all_zero_differences_is_one_and_empty_is_nan():
    assert wilcoxon_p([0.0, 0.0, 0.0]) == 1.0
    assert math.isnan(wilcoxon_p([]))
    assert 0.0 < wilcoxon_p([0.1, 0.2, -0.05, 0.3, 0.0]) <= 1.0


def test_grid_adaptation_all_equal_states_has_zero_score_and_p_one():
    flat = {(Q1, Q2): (1.0, 0.5), (Q2, Q2): (1.0, 0.5)}
    result = TemporalGrid.from_results(_rows(flat)).adaptation("f1")
    assert result == {"score": 0.0, "p_value": 1.0, "n_pairs": 2, "n_cell_pairs": 1}


def test_grid_single_cell_has_nan_scores_not_errors():
    single = TemporalGrid.from_results(_rows({(Q1, Q1): (1.0, 0.0)}))
    assert math.isnan(single.deterioration()["score"]) and single.deterioration()["n_pairs"] == 0
    assert math.isnan(single.adaptation()["p_value"])
    assert single.corners()["new_state_new_test"]["value"] == pytest.approx(0.5)


def test_grid_by_quarter_uses_state_at_lag(grid):
    rows = {(r["quarter"], r["subset"]): r for r in grid.by_quarter(lag=0)}
    assert rows[(Q3, "recent")]["f1"] == 1.0 and rows[(Q3, "recent")]["n"] == 1
    lagged = {(r["quarter"], r["subset"]): r["f1"] for r in grid.by_quarter(lag=-1)}
    assert lagged == {(Q2, "past"): 0.5, (Q2, "recent"): 0.0, (Q3, "past"): 0.0, (Q3, "recent"): 0.5}


def test_grid_summary_is_strict_json(grid):
    summary = grid.summary()
    text = json.dumps(summary, allow_nan=False)
    assert summary["by_subset"]["all"]["f1"]["matrix"][2][0] is None  # empty cell -> null
    assert json.loads(text)["by_subset"]["recent"]["f1"]["lag_table"]["0"] == 1.0
    assert summary["primary_metric"] == "f1" and summary["subsets"] == ["past", "recent"]


def test_grid_from_results_refuses_duplicates_and_bad_quarters():
    rows = _rows()
    with pytest.raises(ValueError, match="two results"):
        TemporalGrid.from_results(rows + rows[:1])
    with pytest.raises(ValueError, match="not a quarter"):
        TemporalGrid.from_results([dict(rows[0], state_quarter="2022-03")])
    with pytest.raises(ValueError, match="lacks"):
        TemporalGrid.from_results([{"question_id": "q"}])
