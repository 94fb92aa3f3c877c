"""An evaluation run as files: a self-contained report.html, PNG plots beside it, summary.json.

Plots use matplotlib's Agg canvas directly (Figure + FigureCanvasAgg, never pyplot), so writing a
report neither needs a display nor changes the process-wide backend. Every part is optional: a
missing grid, a single quarter or empty cells leave out the table or plot they would fill.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from evaluation.temporal import TemporalGrid, jsonable, quarter_index
from evaluation.trust import CONFIDENCE_BANDS, shown_quarters

_PLOTS = {
    "by_quarter": "scores_by_quarter.png",
    "heatmap": "grid_heatmap.png",
    "lag": "lag_curves.png",
    "ds_as": "deterioration_adaptation.png",
}


def _e(value) -> str:
    return html.escape(str(value), quote=True)


def _num(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _p(value) -> str:
    return "–" if value is None or math.isnan(value) else f"{value:.3g}"


def _stars(p: float) -> str:
    if p is None or math.isnan(p):
        return "n/a"
    return "***" if p < 0.001 else "**" if p < 0.01 else "*" if p < 0.05 else "n.s."


def _short(text: str, limit: int = 160) -> str:
    """A run fact as a table cell: long values (the whole grid summary) are in summary.json."""
    return text if len(text) <= limit else text[:limit] + " … (whole value in summary.json)"


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig)
    fig.tight_layout()
    fig.savefig(path, format="png", dpi=110)
    return path


def _subset_labels(grid: TemporalGrid) -> list[tuple[str, str | None]]:
    return [("all", None)] + [(s, s) for s in grid.subsets if s != "all"]


def _plot_by_quarter(rows: list[dict], metric: str, path: Path) -> Path | None:
    points = [r for r in rows if isinstance(r.get(metric), (int, float)) and not math.isnan(r[metric])]
    if not points:
        return None
    quarters = sorted({str(r["quarter"]) for r in points}, key=_quarter_key)
    fig = Figure(figsize=(7, 4))
    ax = fig.add_subplot()
    for subset in sorted({str(r.get("subset", "all")) for r in points}):
        y = [np.nan] * len(quarters)
        for r in points:
            if str(r.get("subset", "all")) == subset:
                y[quarters.index(str(r["quarter"]))] = r[metric]
        ax.plot(range(len(quarters)), y, marker="o", label=subset)
    ax.set_xticks(range(len(quarters)), quarters, rotation=45)
    ax.set(xlabel="question quarter", ylabel=metric, title=f"{metric} by quarter")
    ax.legend()
    return _save(fig, path)


def _plot_heatmap(grid: TemporalGrid, metric: str, path: Path) -> Path | None:
    states, tests, values = grid.matrix(metric)
    if not np.any(~np.isnan(values)):
        return None
    fig = Figure(figsize=(1.2 * len(tests) + 3, 0.8 * len(states) + 2))
    ax = fig.add_subplot()
    image = ax.imshow(np.ma.masked_invalid(values), cmap="viridis", vmin=np.nanmin(values), vmax=np.nanmax(values))
    for i in range(len(states)):
        for j in range(len(tests)):
            if not math.isnan(values[i, j]):
                ax.text(
                    j,
                    i,
                    f"{values[i, j]:.2f}",
                    ha="center",
                    va="center",
                    color="w",
                    fontsize=9,
                    bbox={"facecolor": "black", "alpha": 0.35, "pad": 1, "lw": 0},
                )
    ax.set_xticks(range(len(tests)), tests, rotation=45)
    ax.set_yticks(range(len(states)), states)
    ax.set(
        xlabel="question quarter", ylabel="state (index at end of quarter)", title=f"{metric}: state x question quarter"
    )
    fig.colorbar(image, ax=ax)
    return _save(fig, path)


def _plot_lags(grid: TemporalGrid, metric: str, path: Path) -> Path | None:
    tables = [(label, grid.lag_table(metric, subset)) for label, subset in _subset_labels(grid)]
    if not any(t for _, t in tables):
        return None
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    for label, table in tables:
        if table:
            ax.plot(list(table), list(table.values()), marker="o", label=label)
    ax.axvline(0, color="grey", lw=0.8, ls=":")
    ax.set(xlabel="lag (state - question quarter)", ylabel=metric, title=f"{metric} by lag")
    ax.legend()
    return _save(fig, path)


def _plot_scores(grid: TemporalGrid, metric: str, path: Path) -> Path | None:
    labels = _subset_labels(grid)
    scores = {label: (grid.deterioration(metric, s), grid.adaptation(metric, s)) for label, s in labels}
    if all(math.isnan(d["score"]) and math.isnan(a["score"]) for d, a in scores.values()):
        return None
    fig = Figure(figsize=(1.6 * len(labels) + 3, 4))
    ax = fig.add_subplot()
    width = 0.38
    for k, (name, colour) in enumerate([("DS", "tab:red"), ("AS", "tab:blue")]):
        for x, (label, _) in enumerate(labels):
            result = scores[label][k]
            value = 0.0 if math.isnan(result["score"]) else result["score"]
            pos = x + (k - 0.5) * width
            ax.bar(pos, value, width, color=colour, label=name if x == 0 else None)
            ax.annotate(
                _stars(result["p_value"]), (pos, value), ha="center", va="bottom" if value >= 0 else "top", fontsize=9
            )
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(labels)), [label for label, _ in labels])
    ax.set(ylabel=f"{metric} change per quarter", title="Deterioration (DS) and adaptation (AS)")
    ax.legend()
    return _save(fig, path)


def _quarter_key(q: str):
    try:
        return (0, quarter_index(q), q)
    except ValueError:
        return (1, 0, q)


def _by_quarter_html(rows: list[dict], metric: str) -> str:
    quarters = sorted({str(r["quarter"]) for r in rows}, key=_quarter_key)
    subsets = sorted({str(r.get("subset", "all")) for r in rows})
    cells = {(str(r["quarter"]), str(r.get("subset", "all"))): r for r in rows}
    body = []
    for q in quarters:
        line = [q]
        for s in subsets:
            r = cells.get((q, s))
            line.append("–" if r is None else f"{_num(r.get(metric))} (n={r.get('n', '?')})")
        body.append(line)
    return _table(["quarter"] + [f"{s}: {metric}" for s in subsets], body)


def _grid_html(grid: TemporalGrid, metric: str) -> str:
    labels = _subset_labels(grid)
    states, tests, values = grid.matrix(metric)
    parts = [
        "<h3>Grid (all questions): rows are states, columns question quarters</h3>",
        _table(["state"] + tests, [[s] + [_num(float(v)) for v in row] for s, row in zip(states, values)]),
    ]
    lags = {label: grid.lag_table(metric, s) for label, s in labels}
    all_lags = sorted({lag for t in lags.values() for lag in t})
    parts += [
        "<h3>By lag (state - question quarter)</h3>",
        _table(
            ["lag"] + [label for label, _ in labels],
            [[f"{lag:+d}"] + [_num(lags[label].get(lag)) for label, _ in labels] for lag in all_lags],
        ),
    ]
    rows, corner_rows = [], []
    for label, s in labels:
        ds, ad = grid.deterioration(metric, s), grid.adaptation(metric, s)
        rows.append(
            [
                label,
                _num(ds["score"], 4),
                _p(ds["p_value"]),
                str(ds["n_pairs"]),
                _num(ad["score"], 4),
                _p(ad["p_value"]),
                str(ad["n_pairs"]),
            ]
        )
        corner_rows.append(
            [label]
            + [
                f"{_num(c['value'])} ({c['state'] or '–'} on {c['test'] or '–'})"
                for c in grid.corners(metric, s).values()
            ]
        )
    parts += [
        "<h3>Deterioration (DS) and adaptation (AS), per quarter of distance</h3>",
        "<p>DS &lt; 0: a fixed state gets worse on later questions. AS &gt; 0: newer states do better "
        "on the same questions. p: two-sided Wilcoxon signed-rank test; n: differences tested.</p>",
        _table(["subset", "DS", "DS p", "DS n", "AS", "AS p", "AS n"], rows),
        "<h3>Corners of the lower triangle</h3>",
        _table(
            ["subset", "oldest state, first quarter", "oldest state, newest quarter", "newest state, newest quarter"],
            corner_rows,
        ),
    ]
    return "\n".join(parts)


def _trust_html(trust: dict) -> str:
    """Per quarter: the share of answers a passage read states and EM on those and on the rest; the
    share and EM of each confidence band; the AUC (evaluation.trust)."""
    bands = [name for name, _, _ in CONFIDENCE_BANDS]
    header = (
        ["quarter", "answers", "grounded", "EM grounded", "EM not"]
        + [f"{b} ({lo:g}-{hi:g})" for b, lo, hi in CONFIDENCE_BANDS]
        + ["AUC"]
    )
    rows = []
    for quarter, t in shown_quarters(trust).items():
        g, c = t.get("grounded") or {}, t.get("confidence") or {}
        by_band = {b["band"]: b for b in c.get("bands", [])}
        rows.append(
            [
                quarter,
                str(t["answers"]),
                f"{g['share']:.1f}%" if g else "–",
                _num(g.get("em_grounded"), 1),
                _num(g.get("em_otherwise"), 1),
            ]
            + [f"{by_band[b]['share']:.1f}%, EM {by_band[b]['em']:.1f}" if b in by_band else "–" for b in bands]
            + [_num(c.get("auc"))]
        )
    return (
        "<p>Grounded: a passage the reader read states the answer. The bands are the reader's "
        "probability of its answer, as the ask page shows it; each cell is the share of the answers in "
        "the band and their EM (%). AUC: the chance that a right answer is surer than a wrong one (0.5: "
        "the confidence tells nothing). A band whose EM moves from quarter to quarter no longer means "
        "what the ask page says.</p>\n" + _table(header, rows)
    )


def _transport_html(t: dict) -> str:
    """Drift per month, tau_p / tau_var, and the predicted against the measured F1 per quarter."""
    tr = t["transport"]
    measures = [k for k in (t["months"][0] if t["months"] else {}) if k not in ("month", "quarter", "f1", "n")]
    parts = [
        f"<p>Version {_e(t.get('version', ''))}: source quarter {_e(t['source'])} (F1 {_num(tr['source_score'], 2)}); "
        f"tau_p mean {_num(tr['tau_p_mean'])}, tau_var {_num(tr['tau_var'])} over {tr['n']} quarter(s). "
        f"Drift of each month against the source quarter's months; the regression uses "
        f"<b>{_e(t['measure'])}</b>.</p>",
        _table(
            ["quarter", "n", "F1", "tau_p"],
            [[q, str(r["n"]), _num(r["f1"], 2), _num(tr["tau_p"].get(q))] for q, r in t["quarters"].items()],
        ),
        _table(
            ["month", "n", "F1"] + measures,
            [[m["month"], str(m["n"]), _num(m["f1"], 2)] + [_num(m[k], 4) for k in measures] for m in t["months"]],
        ),
        "<h3>Predicted (before answering) against measured F1</h3>",
        "<p>Each quarter is predicted from the months of earlier quarters only; the no-change forecast "
        "(the previous quarter's F1) is the baseline to beat.</p>",
        _table(
            ["quarter", "drift", "predicted", "measured", "error", "no-change", "its error"],
            [
                [
                    r["quarter"],
                    _num(r["drift"], 4),
                    _num(r["predicted_f1"], 2),
                    _num(r["actual_f1"], 2),
                    _num(r["error"], 2),
                    _num(r["naive_f1"], 2),
                    _num(r["naive_error"], 2),
                ]
                for r in t["predictions"]
            ],
        ),
    ]
    return "\n".join(parts)


def write_report(
    out_dir: Path,
    *,
    title: str,
    summary: dict,
    grid: TemporalGrid | None,
    by_quarter: list[dict] | None,
    metric: str = "f1",
    transport: dict | None = None,
) -> dict[str, Path]:
    """Write report.html, its PNG plots and summary.json into out_dir.

    Args:
        out_dir: folder to write into (created if missing; files of the same names replaced).
        title: the report's title.
        summary: run-level facts (model and index versions, headline scores); shown as a table,
            but for "trust" (evaluation.trust.trust_by_quarter), which gets a section of its own.
        grid: the temporal grid, or None to leave out the grid, lag and DS/AS parts.
        by_quarter: rows {"quarter", "subset", "n", <metric>: value}; None takes
            grid.by_quarter() (state of the question's own quarter) when a grid is given.
        metric: the metric plotted and tabled (the grid's first metric if it lacks this one).
        transport: workers.version_transport.transport_summary of the run's version (drift, tau, predicted
            against measured F1), or None to leave that section out.

    Returns:
        {"html", "summary"} plus one entry per plot written ("by_quarter", "heatmap", "lag",
        "ds_as"), each the file's path.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if by_quarter is None and grid is not None:
        by_quarter = grid.by_quarter()
    if grid is not None and grid.metric_names and metric not in grid.metric_names:
        metric = grid.metric_names[0]
    paths: dict[str, Path] = {}
    plotters = [("by_quarter", lambda p: _plot_by_quarter(by_quarter, metric, p) if by_quarter else None)]
    if grid is not None:
        plotters += [
            ("heatmap", lambda p: _plot_heatmap(grid, metric, p)),
            ("lag", lambda p: _plot_lags(grid, metric, p)),
            ("ds_as", lambda p: _plot_scores(grid, metric, p)),
        ]
    for key, plot in plotters:
        written = plot(out_dir / _PLOTS[key])
        if written is not None:
            paths[key] = written

    document = {
        "title": title,
        "metric": metric,
        "summary": jsonable(summary),
        "grid": grid.summary() if grid is not None else None,
        "by_quarter": jsonable(by_quarter),
        "transport": jsonable(transport),
    }
    paths["summary"] = out_dir / "summary.json"
    paths["summary"].write_text(json.dumps(document, indent=2, default=str, allow_nan=False), encoding="utf-8")

    flat = [
        [k, _short(v if isinstance(v, str) else json.dumps(jsonable(v), default=str))]
        for k, v in summary.items()
        if k != "trust"
    ]
    parts = [
        f"<h1>{_e(title)}</h1>",
        "<h2>Run</h2>",
        _table(["key", "value"], flat) if flat else "<p>No summary.</p>",
        "<h2>Scores by question quarter</h2>",
        _by_quarter_html(by_quarter, metric) if by_quarter else "<p>No per-quarter scores.</p>",
    ]
    if summary.get("trust"):
        parts += ['<h2 id="trust">How far to trust the answers</h2>', _trust_html(summary["trust"])]
    if grid is not None:
        parts += ["<h2>Temporal grid</h2>", _grid_html(grid, metric)]
    if transport is not None:
        parts += ["<h2>Drift and transportability</h2>", _transport_html(transport)]
    parts += ["<h2>Plots</h2>"] + [
        f'<p><img src="{_e(paths[k].name)}" alt="{_e(k)}"></p>' for k in _PLOTS if k in paths
    ]
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;margin:.5em 0}"
        "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}img{max-width:100%}"
    )
    paths["html"] = out_dir / "report.html"
    paths["html"].write_text(
        f'<!DOCTYPE html>\n<html><head><meta charset="utf-8"><title>{_e(title)}</title><style>{style}</style>'
        f"</head><body>\n" + "\n".join(parts) + "\n</body></html>\n",
        encoding="utf-8",
    )
    return paths
