"""The HTML/PNG/JSON report, with every part present and with parts missing."""

from __future__ import annotations

import json
import re

import pytest

from evaluation.report import write_report
from evaluation.temporal import TemporalGrid

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _grid(cells: dict[tuple[str, str], tuple[float, float]], past_name: str = "past") -> TemporalGrid:
    rows = []
    for (state, test), (recent, past) in cells.items():
        for qid, subset, f1 in ((f"r{test}", "recent", recent), (f"p{test}", past_name, past)):
            rows.append(
                {
                    "question_id": qid,
                    "test_quarter": test,
                    "state_quarter": state,
                    "subset": subset,
                    "metrics": {"f1": f1},
                }
            )
    return TemporalGrid.from_results(rows)


FULL = {
    ("2022Q1", "2022Q1"): (1.0, 0.5),
    ("2022Q1", "2022Q2"): (0.0, 0.5),
    ("2022Q2", "2022Q2"): (1.0, 0.5),
    ("2022Q1", "2022Q3"): (0.0, 0.0),
    ("2022Q2", "2022Q3"): (0.5, 0.0),
    ("2022Q3", "2022Q3"): (1.0, 0.5),
}


def _strict_json(path):
    def refuse(name):
        raise AssertionError(f"{name} in JSON")

    return json.loads(path.read_text(encoding="utf-8"), parse_constant=refuse)


def test_write_report_full_files_and_values(tmp_path):
    grid = _grid(FULL)
    paths = write_report(
        tmp_path / "run", title="Run 7", summary={"model": "fid-small", "f1": 0.5}, grid=grid, by_quarter=None
    )
    assert set(paths) == {"html", "summary", "by_quarter", "heatmap", "lag", "ds_as"}
    for key in ("by_quarter", "heatmap", "lag", "ds_as"):
        assert paths[key].read_bytes()[:8] == PNG_MAGIC
    page = paths["html"].read_text(encoding="utf-8")
    ds, ad = grid.deterioration("f1"), grid.adaptation("f1")
    assert f"{ds['score']:.4f}" in page and f"{ad['score']:.4f}" in page
    assert "-0.4062" in page  # DS of the hand-computed grid (see test_temporal_grid)
    assert f"{ds['p_value']:.3g}" in page
    for src in re.findall(r'<img src="([^"]+)"', page):
        assert (paths["html"].parent / src).is_file()
    data = _strict_json(paths["summary"])
    assert data["grid"]["by_subset"]["all"]["f1"]["deterioration"]["score"] == pytest.approx(ds["score"])
    assert data["summary"]["model"] == "fid-small"


def test_write_report_escapes_every_string(tmp_path):
    grid = _grid(FULL, past_name="<b>past</b>")
    paths = write_report(
        tmp_path, title="<script>alert(1)</script>", summary={"note": "a & b <i>"}, grid=grid, by_quarter=None
    )
    page = paths["html"].read_text(encoding="utf-8")
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "<b>past</b>" not in page and "&lt;b&gt;past&lt;/b&gt;" in page
    assert "a &amp; b &lt;i&gt;" in page


def test_write_report_without_grid_or_quarters(tmp_path):
    paths = write_report(tmp_path, title="empty", summary={}, grid=None, by_quarter=None)
    assert set(paths) == {"html", "summary"}
    assert "<img" not in paths["html"].read_text(encoding="utf-8")
    assert _strict_json(paths["summary"])["grid"] is None


def test_write_report_by_quarter_only_with_nan(tmp_path):
    rows = [
        {"quarter": "2022Q1", "subset": "recent", "n": 3, "f1": 0.4},
        {"quarter": "2022Q1", "subset": "past", "n": 2, "f1": float("nan")},
    ]
    paths = write_report(tmp_path, title="t", summary={"x": float("nan")}, grid=None, by_quarter=rows)
    assert paths["by_quarter"].read_bytes()[:8] == PNG_MAGIC
    assert "0.400 (n=3)" in paths["html"].read_text(encoding="utf-8")
    assert _strict_json(paths["summary"])["summary"]["x"] is None


def test_write_report_single_quarter_grid(tmp_path):
    grid = _grid({("2022Q1", "2022Q1"): (1.0, 0.0)})
    paths = write_report(tmp_path, title="one", summary={}, grid=grid, by_quarter=None)
    # One cell: no DS/AS pair, so no bar chart, but the heat map, lag curve and table are written.
    assert {"html", "summary", "heatmap", "lag", "by_quarter"} <= set(paths) and "ds_as" not in paths
    assert paths["heatmap"].read_bytes()[:8] == PNG_MAGIC


def test_write_report_grid_with_empty_cells(tmp_path):
    sparse = {("2022Q1", "2022Q1"): (1.0, 0.5), ("2022Q1", "2022Q4"): (0.0, 0.5), ("2022Q3", "2022Q4"): (1.0, 1.0)}
    paths = write_report(tmp_path, title="sparse", summary={}, grid=_grid(sparse), by_quarter=None)
    assert paths["ds_as"].read_bytes()[:8] == PNG_MAGIC
    matrix = _strict_json(paths["summary"])["grid"]["by_subset"]["all"]["f1"]["matrix"]
    assert matrix[1][0] is None  # state 2022Q3 on test 2022Q1: empty
