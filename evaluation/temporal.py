"""The temporal grid of Agarwal & Nenkova (TACL 2022): every state on every test quarter.

A *state* is the index (and model) snapshot taken at the end of a quarter; a *test quarter* is the
quarter in which questions are asked. Cell P[s, t] is the mean of a per-question metric for the
questions of quarter t answered with state s. The lower triangle (s <= t: the state is at most as
new as the questions, lag <= 0) is where the two temporal effects are measured:

- Temporal deterioration: a fixed state evaluated on later and later quarters (a row).
- Temporal adaptation: a fixed quarter answered with newer and newer states (a column).

Definitions implemented. The paper's full text could not be retrieved here (only its abstract),
so these are the natural definitions, normalised per quarter of distance:

    DS = mean over states s and test quarters s <= t1 < t2 of (P[s, t2] - P[s, t1]) / (t2 - t1)
    AS = mean over test quarters t and states s1 < s2 <= t of (P[s2, t] - P[s1, t]) / (s2 - s1)

Signs: DS < 0 means a fixed state gets worse on later questions (deterioration); AS > 0 means
updating the state helps on a fixed quarter (adaptation). Differences are in metric units per
quarter. Significance: a two-sided Wilcoxon signed-rank test (scipy.stats.wilcoxon, zeros dropped)
that the differences are centred on 0. For AS the same questions are answered by both states, so
the test runs over per-question paired differences (each divided by s2 - s1); for DS the two cells
hold different questions, so it runs over the per-cell differences. When every difference is zero
the p-value is 1.0 (no evidence of any effect); with no differences at all it is NaN.

Lag = state - test in quarters, as in StreamingQA's lag analysis: -1 means the index stops at the
end of the quarter before the question's, 0 the end of the question's own quarter.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from itertools import combinations

import numpy as np

_QUARTER = re.compile(r"^(\d{4})Q([1-4])$")


def quarter_index(q: str) -> int:
    """Quarter as a running integer, so that differences are in quarters.

    Args:
        q: a quarter such as "2022Q3".

    Returns:
        4 * year + (quarter - 1); quarter_index("2023Q1") - quarter_index("2022Q3") == 2.
    """
    m = _QUARTER.match(q) if isinstance(q, str) else None
    if m is None:
        raise ValueError(f"{q!r} is not a quarter (use YYYYQn, e.g. 2022Q3)")
    return 4 * int(m.group(1)) + int(m.group(2)) - 1


def _quarter_name(index: int) -> str:
    return f"{index // 4}Q{index % 4 + 1}"


def shift_quarter(q: str, n: int) -> str:
    """The quarter n quarters after q (before, for n < 0): shift_quarter("2022Q4", 1) == "2023Q1"."""
    return _quarter_name(quarter_index(q) + n)


def quarter_of(day: date | datetime | str) -> str:
    """The quarter of a date.

    Args:
        day: a date, a timezone-aware datetime (taken in UTC) or "YYYY-MM-DD".

    Returns:
        e.g. "2023Q1" for 2023-02-14.
    """
    if isinstance(day, datetime):
        if day.tzinfo is None:
            raise ValueError(f"datetime {day.isoformat()} is naive (give a timezone-aware UTC datetime or a date)")
        day = day.astimezone(UTC).date()
    elif isinstance(day, str):
        try:
            day = date.fromisoformat(day)
        except ValueError:
            raise ValueError(f"{day!r} is not a date (use YYYY-MM-DD)") from None
    return f"{day.year}Q{(day.month - 1) // 3 + 1}"


def quarter_bounds(q: str) -> tuple[date, date]:
    """First and last day of a quarter: quarter_bounds("2023Q2") == (2023-04-01, 2023-06-30)."""
    i = quarter_index(q)
    year, first_month = i // 4, 3 * (i % 4) + 1
    nxt = date(year + (first_month == 10), (first_month + 2) % 12 + 1, 1)
    return date(year, first_month, 1), nxt - timedelta(days=1)


def quarter_range(first: str, last: str) -> list[str]:
    """Every quarter from first to last, both included.

    Returns:
        e.g. quarter_range("2022Q3", "2023Q1") == ["2022Q3", "2022Q4", "2023Q1"].
    """
    lo, hi = quarter_index(first), quarter_index(last)
    if lo > hi:
        raise ValueError(f"quarter range {first}..{last} is empty (first must not be after last)")
    return [_quarter_name(i) for i in range(lo, hi + 1)]


def wilcoxon_p(differences: Iterable[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value that the differences are centred on zero.

    The exact distribution for at most 50 differences without ties or zeros, the normal
    approximation otherwise (`wilcoxon_method`).

    Returns:
        The p-value; 1.0 when every difference is zero (scipy versions disagree there: some
        raise, some return NaN); NaN when there are no differences.
    """
    d = np.asarray([x for x in differences if not math.isnan(x)], dtype=float)
    if d.size == 0:
        return math.nan
    if not np.any(d != 0):
        return 1.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # normal approximation with many ties
        from scipy.stats import wilcoxon  # noqa: PLC0415 (lazy: scipy.stats, ~0.6 s to import)

        return float(wilcoxon(d, zero_method="wilcox", alternative="two-sided", method=wilcoxon_method(d)).pvalue)


def wilcoxon_method(d: np.ndarray) -> str:
    """ "exact" for at most 50 differences with no ties and no zeros, else "asymptotic" (SciPy's
    rule before 1.15). Newer SciPy's "auto" answers ties by enumerating all 2^n sign flips: 4 s for
    12 tied differences here, doubling with each one more, where the quarterly grids have many."""
    nonzero = np.abs(d[d != 0])
    ties = np.unique(nonzero).size < nonzero.size
    return "exact" if nonzero.size == d.size and not ties and d.size <= 50 else "asymptotic"


@dataclass(frozen=True)
class _Result:
    question_id: str
    test_quarter: str
    state_quarter: str
    subset: str
    metrics: dict[str, float]


def _mean(values: list[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def jsonable(value):
    """A copy of nested dicts/lists with NaN -> None and numpy scalars -> Python, for JSON.

    Args:
        value: a number, string, dict, list or tuple (nested freely).

    Returns:
        The same structure, safe for json.dumps(allow_nan=False); dict keys become strings.
    """
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (float, np.floating)):
        return None if math.isnan(value) else float(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    return value


class TemporalGrid:
    """Per-question results of several states on several test quarters, and their summaries.

    Example:
        >>> grid = TemporalGrid.from_results([
        ...     {"question_id": "q1", "test_quarter": "2022Q3", "state_quarter": "2022Q3",
        ...      "subset": "recent", "metrics": {"f1": 0.5}}])
        >>> grid.cell("2022Q3", "2022Q3")
        0.5
    """

    primary_metric = "f1"
    greater_is_better = True

    def __init__(self, results: list[_Result]):
        self._cells: dict[tuple[str, str], list[_Result]] = {}
        for r in results:
            self._cells.setdefault((r.state_quarter, r.test_quarter), []).append(r)
        self.states = sorted({r.state_quarter for r in results}, key=quarter_index)
        self.tests = sorted({r.test_quarter for r in results}, key=quarter_index)
        self.metric_names = sorted({m for r in results for m in r.metrics})
        self.subsets = sorted({r.subset for r in results})
        self.n_results = len(results)

    @classmethod
    def from_results(cls, rows: Iterable[dict]) -> TemporalGrid:
        """Build a grid from per-question rows.

        Args:
            rows: dicts with question_id, test_quarter, state_quarter ("2022Q3"), subset
                ("recent", "past" or another name; missing -> "other") and metrics (name -> float).

        Returns:
            The grid. A (question_id, state_quarter) pair seen twice is refused.
        """
        results, seen = [], set()
        for i, row in enumerate(rows):
            missing = {"question_id", "test_quarter", "state_quarter", "metrics"} - set(row)
            if missing:
                raise ValueError(f"result row {i} lacks {sorted(missing)}")
            for field in ("test_quarter", "state_quarter"):
                quarter_index(row[field])  # refuses a malformed quarter with a clear message
            key = (str(row["question_id"]), row["state_quarter"])
            if key in seen:
                raise ValueError(f"question {key[0]} has two results for state {key[1]} (give one row per pair)")
            seen.add(key)
            metrics = {str(k): float(v) for k, v in row["metrics"].items()}
            results.append(
                _Result(key[0], row["test_quarter"], row["state_quarter"], str(row.get("subset") or "other"), metrics)
            )
        return cls(results)

    def _scores(self, state: str, test: str, metric: str, subset: str | None) -> dict[str, float]:
        """question_id -> score in one cell (questions lacking the metric or the subset left out)."""
        return {
            r.question_id: r.metrics[metric]
            for r in self._cells.get((state, test), [])
            if metric in r.metrics and not math.isnan(r.metrics[metric]) and (subset is None or r.subset == subset)
        }

    def cell(self, state: str, test: str, metric: str = "f1", subset: str | None = None) -> float | None:
        """Mean metric of one state on one test quarter; None when the cell is empty."""
        return _mean(list(self._scores(state, test, metric, subset).values()))

    def count(self, state: str, test: str, metric: str = "f1", subset: str | None = None) -> int:
        """Number of questions behind cell(state, test)."""
        return len(self._scores(state, test, metric, subset))

    def matrix(self, metric: str = "f1", subset: str | None = None) -> tuple[list[str], list[str], np.ndarray]:
        """All cells as a states x tests array.

        Returns:
            (states, tests, values) with values[i, j] = cell(states[i], tests[j]), NaN if empty.
        """
        values = np.full((len(self.states), len(self.tests)), np.nan)
        for i, s in enumerate(self.states):
            for j, t in enumerate(self.tests):
                v = self.cell(s, t, metric, subset)
                if v is not None:
                    values[i, j] = v
        return list(self.states), list(self.tests), values

    def lag_table(self, metric: str = "f1", subset: str | None = None) -> dict[int, float]:
        """Mean metric by lag = state - test in quarters, pooled over all questions at that lag.

        Returns:
            {lag: mean}, sorted by lag; lags with no question are absent.
        """
        pooled: dict[int, list[float]] = {}
        for s, t in self._cells:
            scores = self._scores(s, t, metric, subset).values()
            pooled.setdefault(quarter_index(s) - quarter_index(t), []).extend(scores)
        return {lag: _mean(v) for lag, v in sorted(pooled.items()) if v}

    def deterioration(self, metric: str = "f1", subset: str | None = None) -> dict[str, float]:
        """Deterioration score (see the module docstring): a fixed state on later quarters.

        Returns:
            {"score", "p_value", "n_pairs"}: NaN score and p-value when no row has two cells.
        """
        states, tests, values = self.matrix(metric, subset)
        diffs = []
        for i, s in enumerate(states):
            row = [
                (j, quarter_index(t))
                for j, t in enumerate(tests)
                if quarter_index(t) >= quarter_index(s) and not math.isnan(values[i, j])
            ]
            for (j1, t1), (j2, t2) in combinations(row, 2):
                diffs.append((values[i, j2] - values[i, j1]) / (t2 - t1))
        return {
            "score": float(np.mean(diffs)) if diffs else math.nan,
            "p_value": wilcoxon_p(diffs),
            "n_pairs": len(diffs),
        }

    def adaptation(self, metric: str = "f1", subset: str | None = None) -> dict[str, float]:
        """Adaptation score (see the module docstring): newer states on a fixed quarter.

        Returns:
            {"score", "p_value", "n_pairs", "n_cell_pairs"}: the score averages the cell
            differences; the test and n_pairs use per-question paired differences (per-cell ones
            when no question was answered by both states).
        """
        states, tests, values = self.matrix(metric, subset)
        cell_diffs, paired = [], []
        for j, t in enumerate(tests):
            column = [
                (i, s)
                for i, s in enumerate(states)
                if quarter_index(s) <= quarter_index(t) and not math.isnan(values[i, j])
            ]
            for (i1, s1), (i2, s2) in combinations(column, 2):
                gap = quarter_index(s2) - quarter_index(s1)
                cell_diffs.append((values[i2, j] - values[i1, j]) / gap)
                old, new = self._scores(s1, t, metric, subset), self._scores(s2, t, metric, subset)
                paired.extend((new[q] - old[q]) / gap for q in sorted(old.keys() & new.keys()))
        tested = paired or cell_diffs
        return {
            "score": float(np.mean(cell_diffs)) if cell_diffs else math.nan,
            "p_value": wilcoxon_p(tested),
            "n_pairs": len(tested),
            "n_cell_pairs": len(cell_diffs),
        }

    def corners(self, metric: str = "f1", subset: str | None = None) -> dict[str, dict]:
        """Three salient cells of the lower triangle (s <= t).

        Returns:
            {"old_state_old_test", "old_state_new_test", "new_state_new_test"}, each
            {"state", "test", "value"} (None where missing): the oldest state on its first
            quarter, the oldest state on the newest quarter (old_new - old_old shows
            deterioration) and the newest state on the newest quarter (new_new - old_new shows
            adaptation).
        """
        states, tests, values = self.matrix(metric, subset)
        filled = [
            (s, t, float(values[i, j]))
            for i, s in enumerate(states)
            for j, t in enumerate(tests)
            if quarter_index(s) <= quarter_index(t) and not math.isnan(values[i, j])
        ]
        empty = {"state": None, "test": None, "value": None}
        if not filled:
            return {k: dict(empty) for k in ("old_state_old_test", "old_state_new_test", "new_state_new_test")}
        old_state = min((s for s, _, _ in filled), key=quarter_index)
        old_test = min((t for s, t, _ in filled if s == old_state), key=quarter_index)
        new_test = max((t for _, t, _ in filled), key=quarter_index)
        new_state = max((s for s, t, _ in filled if t == new_test), key=quarter_index)
        return {
            "old_state_old_test": {
                "state": old_state,
                "test": old_test,
                "value": self.cell(old_state, old_test, metric, subset),
            },
            "old_state_new_test": {
                "state": old_state,
                "test": new_test,
                "value": self.cell(old_state, new_test, metric, subset),
            },
            "new_state_new_test": {
                "state": new_state,
                "test": new_test,
                "value": self.cell(new_state, new_test, metric, subset),
            },
        }

    def by_quarter(self, lag: int = 0) -> list[dict]:
        """Scores per test quarter and subset with the state at a given lag (default: same quarter).

        Returns:
            [{"quarter", "subset", "n", <metric>: mean, ...}] for quarters that have that state.
        """
        rows = []
        for t in self.tests:
            s = _quarter_name(quarter_index(t) + lag)
            for subset in self.subsets:
                results = [r for r in self._cells.get((s, t), []) if r.subset == subset]
                if not results:
                    continue
                row = {"quarter": t, "subset": subset, "n": len(results)}
                for m in self.metric_names:
                    row[m] = _mean([r.metrics[m] for r in results if m in r.metrics and not math.isnan(r.metrics[m])])
                rows.append(row)
        return rows

    def summary(self) -> dict:
        """Everything above for every metric, over all questions and per subset.

        Returns:
            A JSON-serialisable dict (NaN written as null, lag keys as strings).
        """
        by_subset = {}
        # "all" pools every subset; a subset literally named "all" would be shadowed by it.
        for label, subset in [("all", None)] + [(s, s) for s in self.subsets if s != "all"]:
            by_subset[label] = {
                m: {
                    "matrix": self.matrix(m, subset)[2].tolist(),
                    "counts": [[self.count(s, t, m, subset) for t in self.tests] for s in self.states],
                    "lag_table": self.lag_table(m, subset),
                    "deterioration": self.deterioration(m, subset),
                    "adaptation": self.adaptation(m, subset),
                    "corners": self.corners(m, subset),
                }
                for m in self.metric_names
            }
        return jsonable(
            {
                "primary_metric": self.primary_metric,
                "greater_is_better": self.greater_is_better,
                "states": self.states,
                "tests": self.tests,
                "metrics": self.metric_names,
                "subsets": self.subsets,
                "n_results": self.n_results,
                "by_subset": by_subset,
            }
        )
