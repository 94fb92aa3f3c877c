"""`sqa evaluate`, `replay`, `estimate`, `transport`, `report` and `drift`: how well it does, over time."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

from app.cli.common import cli, fail, guard, num, open_database, run_job, settings
from indexer.dates import month_key, parse_month
from settings import DRIFT_MEASURES, parse_drift_features


def _print_run(run_id: int) -> None:
    from evaluation.trust import describe, shown_quarters  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: evaluation.trust pulls numpy)
    from store.tables import EvalRun  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.tables pulls sqlalchemy)

    db = open_database(settings(), migrate=False)
    try:
        with db.sessions() as session:
            run = session.get(EvalRun, run_id)
            summary, report_dir = run.summary or {}, run.report_dir
    finally:
        db.close()
    typer.echo(f"evaluation run {run_id}: {summary.get('n_results', 0)} results; report in {report_dir}")
    for subset, metrics in (summary.get("by_subset") or {}).items():
        for metric in ("f1", "em", "recall"):
            m = metrics.get(metric)
            if not m:
                continue
            lags = ", ".join(
                f"{int(k):+d}Q {v:.3f}"
                for k, v in sorted(m["lag_table"].items(), key=lambda kv: int(kv[0]))
                if v is not None
            )
            d, a = m["deterioration"], m["adaptation"]
            typer.echo(f"  {subset:8s} {metric:6s} lag: {lags}")
            if d.get("n_pairs") or a.get("n_pairs"):
                typer.echo(
                    f"  {'':8s} {'':6s} DS {d.get('score')} (p={d.get('p_value')}, n={d.get('n_pairs')}); "
                    f"AS {a.get('score')} (p={a.get('p_value')}, n={a.get('n_pairs')})"
                )
    for quarter, trust in shown_quarters(summary.get("trust") or {}).items():
        typer.echo(
            f"  how far to trust the answers of {quarter} ({trust['answers']} answers, each quarter under its "
            f"own quarter's index where the run has it):"
        )
        for line in describe(trust):
            typer.echo(f"    {line}")


@cli.command("evaluate", epilog="Example: sqa evaluate --quarter 2023Q2 --max-questions 200")
@guard
def evaluate(
    quarter: str = typer.Option(..., help="YYYYQn: the question quarter, answered with the serving index"),
    max_questions: int | None = typer.Option(
        None, help="questions the reader answers (default SQA_EVAL_MAX_QUESTIONS; 0: all); recall covers all"
    ),
) -> None:
    """Evaluate a quarter's questions (as of their own dates) against the serving index."""
    from evaluation.temporal import quarter_bounds  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: evaluation.temporal pulls numpy)
    from workers.evaluate import evaluate_current  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.evaluate pulls faiss)

    quarter_bounds(quarter)
    cfg_max = settings().eval_max_questions if max_questions is None else max_questions

    def work(ctx, job):
        return evaluate_current(
            ctx.sessions,
            ctx.load_answer_service(),
            quarter,
            ctx.eval_config(max_questions),
            ctx.reports_dir,
            job_id=job.job_id,
            progress=job,
        )

    _print_run(run_job("evaluation", {"quarter": quarter, "max_questions": cfg_max}, work, result_key="eval_run"))


@cli.command("replay", epilog="Example: sqa replay --from 2023-01 --to 2023-06")
@guard
def replay(
    from_: str = typer.Option(..., "--from", help="YYYY-MM: the first month of the stream"),
    to: str = typer.Option(..., "--to", help="YYYY-MM: the last month"),
    max_questions: int | None = typer.Option(
        None, help="questions per quarter the reader answers (default SQA_EVAL_MAX_QUESTIONS; 0: all)"
    ),
) -> None:
    """Replay the stream: ingest month by month, keep quarter-end states, evaluate the temporal grid."""
    from workers.replay import ReplayPlan, run_replay  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.replay pulls faiss)

    if parse_month(from_) > parse_month(to):
        fail(f"--from {from_} is after --to {to}")
    cfg_max = settings().eval_max_questions if max_questions is None else max_questions
    plan = ReplayPlan(from_, to)

    def work(ctx, job):
        return run_replay(
            ctx.sessions,
            ctx.load_answer_service(),
            ctx.ingest,
            plan,
            ctx.eval_config(max_questions),
            ctx.reports_dir,
            job_id=job.job_id,
            progress=job,
            bar=ctx.runner.bar,
        )

    _print_run(run_job("replay", {"from": from_, "to": to, "max_questions": cfg_max}, work, result_key="eval_run"))


def _print_estimate(result: dict) -> None:
    c = result["counts"]
    typer.echo(
        f"pool {', '.join(result['config']['pool'])}: {c['pool']} questions; new sample "
        f"{result['config']['new']}: {c['new']} questions (F1 in points; learner: candidate ranker, "
        f"baseline: the majority training answer)"
    )
    typer.echo(
        f"{'split':12s} {'splits':>6s} {'n_test':>6s} {'estimate':>8s} {'std':>6s} {'min':>6s} {'max':>6s} "
        f"{'baseline':>8s} {'err.red':>7s} {'vs new':>7s}"
    )
    for r in result["table"]:
        typer.echo(
            f"{r['strategy']:12s} {r['splits']:6d} {r['n_test']:6d} {r['estimate']:8.2f} {r['std']:6.2f} "
            f"{r['min']:6.2f} {r['max']:6.2f} {r['baseline']:8.2f} {100 * r['error_reduction']:6.1f}% "
            f"{r['diff_from_temporal']:+7.2f}"
        )


@cli.command("estimate", epilog="Example: sqa estimate --pool 2022Q3..2023Q1 --new 2023Q2 --split random,temporal")
@guard
def estimate(
    pool: str = typer.Option(..., help="question quarters to estimate from: 2022Q3,2022Q4 or 2022Q3..2023Q1"),
    split: str = typer.Option("all", help="random | length | adversarial | temporal | all (comma-separated)"),
    new: str | None = typer.Option(
        None, help="YYYYQn: the new sample for the temporal split (default: the quarter after the pool)"
    ),
    k: int = typer.Option(5, help="repeats of the random and adversarial splits"),
    test_fraction: float = typer.Option(0.1, help="share of the pool held out"),
    passages: int = typer.Option(10, min=1, max=50, help="retrieved passages per question"),
    seed: int = typer.Option(0),
    out: Path | None = typer.Option(None, help="also write the result as JSON here"),
) -> None:
    """Estimate performance on new questions from a pool, under random, length, adversarial and temporal splits."""
    from evaluation.splits import STRATEGIES  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: evaluation.splits pulls numpy)
    from evaluation.temporal import quarter_index, shift_quarter  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: evaluation.temporal pulls numpy)
    from workers.estimate import EstimateConfig, parse_pool, run_estimate  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.estimate pulls torch)

    quarters = parse_pool(pool)
    if not quarters:
        fail("--pool names no quarter (e.g. --pool 2022Q3,2022Q4)")
    strategies = STRATEGIES if split.strip() == "all" else tuple(x.strip() for x in split.split(",") if x.strip())
    last = max(quarters, key=quarter_index)
    cfg = EstimateConfig(
        pool=quarters,
        new=new or shift_quarter(last, 1),
        strategies=strategies,
        k=k,
        test_fraction=test_fraction,
        passages=passages,
        seed=seed,
    )
    result = run_job(
        "estimate",
        {"pool": list(quarters), "new": cfg.new, "split": list(strategies)},
        lambda ctx, job: run_estimate(ctx, cfg, job),
        result_key="estimate",
    )
    _print_estimate(result)
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
        typer.echo(f"written to {out}")


def _print_transport(version: str, t: dict) -> None:
    tr = t["transport"]
    typer.echo(
        f"{version}: source {t['source']} (F1 {num(tr['source_score'])}), tau_p mean {num(tr['tau_p_mean'], 3)}, "
        f"tau_var {num(tr['tau_var'], 3)} over {tr['n']} quarter(s); drift measure {t['measure']}"
    )
    typer.echo(f"  {'quarter':8s} {'n':>5s} {'F1':>6s} {'tau_p':>6s}")
    for q, row in t["quarters"].items():
        typer.echo(f"  {q:8s} {row['n']:5d} {num(row['f1']):>6s} {num(tr['tau_p'].get(q), 3):>6s}")
    typer.echo(
        f"  {'month':8s} {'n':>5s} {'F1':>6s} "
        + " ".join(f"{k:>10s}" for k in t["months"][0] if k not in ("month", "quarter", "f1", "n"))
    )
    for m in t["months"]:
        typer.echo(
            f"  {m['month']:8s} {m['n']:5d} {num(m['f1']):>6s} "
            + " ".join(f"{num(v, 4):>10s}" for k, v in m.items() if k not in ("month", "quarter", "f1", "n"))
        )
    typer.echo(
        f"  {'predict':8s} {'drift':>8s} {'pred F1':>8s} {'actual':>7s} {'error':>7s} {'naive':>7s} {'n.err':>7s}"
    )
    for r in t["predictions"]:
        typer.echo(
            f"  {r['quarter']:8s} {num(r['drift'], 4):>8s} {num(r['predicted_f1']):>8s} {num(r['actual_f1']):>7s} "
            f"{num(r['error'], sign=True):>7s} {num(r['naive_f1']):>7s} {num(r['naive_error'], sign=True):>7s}"
        )
    typer.echo(
        f"  mean |error|: regression {num(t['mean_abs_error'])}, no-change forecast {num(t['naive_mean_abs_error'])}"
    )


@cli.command("transport", epilog="Example: sqa transport")
@guard
def transport(
    version: str | None = typer.Option(
        None, help='the version to report ("<reader> @ <encoder>"; default: every evaluated version)'
    ),
    measure: str = typer.Option(
        "cosine",
        help="drift measure for the regression: cosine | kl | "
        "unseen_words | unseen_words_tokens | unseen_entities | ...",
    ),
    source: str | None = typer.Option(None, help="YYYYQn: the source quarter (default: the first evaluated)"),
    out: Path | None = typer.Option(None, help="also write the result as JSON here"),
) -> None:
    """Transportability (tau_p, tau_var) per version and predicted against actual F1 per quarter."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import transport_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from workers.version_transport import month_scores, profile_loader, transport_summary  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.version_transport pulls faiss)

    s = settings()
    db = open_database(s)
    try:
        with db.sessions() as session:
            scores = month_scores(session)
            if version is not None and version not in scores:
                fail(f"no evaluated questions for version {version!r} (have: {', '.join(sorted(scores)) or 'none'})")
            load = profile_loader(session, transport_config(s))
            results = {
                v: transport_summary(sc, load, measure=measure, source=source)
                for v, sc in sorted(scores.items())
                if version is None or v == version
            }
    finally:
        db.close()
    if not results:
        fail("no evaluation results yet: run `sqa evaluate --quarter YYYYQn` for two or more quarters")
    for v, t in results.items():
        _print_transport(v, t)
    if out is not None:
        out.write_text(json.dumps(results, indent=2, default=str))
        typer.echo(f"written to {out}")


@cli.command("report", epilog="Example: sqa report 3 --out reports/2023Q2")
@guard
def report(
    run_id: int, out: Path = typer.Option(..., "--out", help="folder for report.html, PNGs, summary.json")
) -> None:
    """Write an evaluation run's HTML report, plots and JSON summary (recomputed from stored results)."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import eval_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from store.tables import EvalRun  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.tables pulls sqlalchemy)
    from workers.evaluate import render_report  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.evaluate pulls faiss)

    s = settings()
    db = open_database(s)
    try:
        with db.sessions() as session:
            run = session.get(EvalRun, run_id)
            if run is None:
                fail(f"no evaluation run with id {run_id}")
            title = f"Evaluation run {run_id} ({run.kind})"
        _, files = render_report(db.sessions, run_id, out, title, eval_config(s))
    finally:
        db.close()
    for name, path in files.items():
        typer.echo(f"{name}: {path}")


# ---- drift of each month --------------------------------------------------------------------------


def _print_drift(rows: list[dict]) -> None:
    measures = [m for m in DRIFT_MEASURES if any(m in r["measures"] for r in rows)]
    typer.echo(
        f"{'month':7s}  {'reference':9s}  {'months':16s}  {'n':>6s}  {'n_ref':>7s}  "
        + "  ".join(f"{m:>{max(len(m), 8)}s}" for m in measures)
    )
    for r in rows:
        span = (
            r["reference_first"]
            if r["reference_first"] == r["reference_last"]
            else f"{r['reference_first']}..{r['reference_last']}"
        )
        values = "  ".join(
            f"{r['measures'][m]:>{max(len(m), 8)}.4f}" if m in r["measures"] else f"{'-':>{max(len(m), 8)}s}"
            for m in measures
        )
        typer.echo(
            f"{r['month']:7s}  {r['reference']:9s}  {span:16s}  {r['n_target']:6d}  {r['n_source']:7d}  {values}"
        )


@cli.command("drift", epilog="Example: sqa drift --from 2023-01 --to 2023-06")
@guard
def drift(
    month: str | None = typer.Option(None, help="YYYY-MM: this month only"),
    from_: str | None = typer.Option(None, "--from", help="YYYY-MM: the first month (default: the first ingested)"),
    to: str | None = typer.Option(None, help="YYYY-MM: the last month (default: the last ingested)"),
    features: str | None = typer.Option(
        None, help="words and/or entities, comma-separated (default SQA_DRIFT_FEATURES; entities are slow)"
    ),
    recompute: bool = typer.Option(
        False, "--recompute", help="rebuild the month profiles and replace rows that are up to date"
    ),
) -> None:
    """Compute (backfill) each ingested month's drift from the previous, earlier and training months."""
    from app.bootstrap import show_bars  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import drift_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from workers.month_drift import backfill_drift  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.month_drift pulls faiss)

    if month and (from_ or to):
        fail("give --month, or --from/--to, not both")
    first = last = month_key(parse_month(month)) if month else None
    if not month:
        first = month_key(parse_month(from_)) if from_ else None
        last = month_key(parse_month(to)) if to else None
        if first and last and first > last:
            fail(f"--from {first} is after --to {last}")
    s = settings()
    cfg = drift_config(s)
    if features is not None:
        cfg = dataclasses.replace(cfg, features=parse_drift_features(features))
    bar = show_bars()

    def progress(m: str, done: int, total: int) -> None:  # entities only: spaCy is the slow part
        if bar:
            typer.echo(f"\rentities of {m}: {done}/{total}", err=True, nl=done >= total)

    db = open_database(s)
    try:
        rows = backfill_drift(
            db.sessions, s.index_dir, cfg, first=first, last=last, recompute=recompute, progress=progress
        )
    finally:
        db.close()
    if not rows:
        typer.echo("no drift to show: the first ingested month has no earlier month (and no trained reader is active)")
        return
    _print_drift(rows)
