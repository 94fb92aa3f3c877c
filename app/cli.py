"""`sqa`: the command line. Reads the settings once and passes plain values down."""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
from pathlib import Path
from typing import Optional

import typer

from app.core.config import Settings, get_settings

cli = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Streaming QA over time-stamped news. All state lives under SQA_HOME (default ./.sqa).")
db_cli = typer.Typer(no_args_is_help=True, help="Database schema.")
import_cli = typer.Typer(no_args_is_help=True, help="Import articles and questions.")
index_cli = typer.Typer(no_args_is_help=True, help="Index snapshots.")
jobs_cli = typer.Typer(no_args_is_help=True, help="Jobs.")
cli.add_typer(db_cli, name="db")
cli.add_typer(import_cli, name="import")
cli.add_typer(index_cli, name="index")
cli.add_typer(jobs_cli, name="jobs")


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _settings() -> Settings:
    try:
        return get_settings()
    except Exception as exc:  # pydantic's ValidationError: say which setting is wrong
        fail(f"bad settings: {exc}")
        raise


def _day(value: str | None, what: str) -> dt.date | None:
    from indexer.dates import InvalidDateError, parse_day

    if value is None:
        return None
    try:
        return parse_day(value, what=what)
    except InvalidDateError as exc:
        fail(str(exc))
        raise


def _show_bar() -> bool:
    """Draw progress bars on a terminal, or anywhere with SQA_PROGRESS=1."""
    return sys.stderr.isatty() or os.environ.get("SQA_PROGRESS") == "1"


def _guard(fn):
    """Turn domain errors into a one-line CLI error with a non-zero exit."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from app.services.errors import ServiceError
        from indexer.dates import InvalidDateError
        from indexer.errors import IndexIntegrityError

        try:
            return fn(*args, **kwargs)
        except (ServiceError, InvalidDateError, IndexIntegrityError, FileNotFoundError, ValueError) as exc:
            fail(str(exc))

    return wrapper


# ---- db --------------------------------------------------------------------------------------------

@db_cli.command("upgrade")
@_guard
def db_upgrade() -> None:
    """Apply the database migrations (also done automatically on start)."""
    from app.db.migrate import upgrade

    s = _settings()
    s.ensure_dirs()
    upgrade(s.db_url)
    typer.echo(f"database at {s.db_url.split('@')[-1]} is at the newest schema")


# ---- import ----------------------------------------------------------------------------------------

def _store(articles, questions, report) -> None:
    from app.runtime import open_database
    from workers.imports import store_records

    db = open_database(_settings())
    try:
        result = store_records(db.sessions, articles, questions)
    finally:
        db.close()
    a, q = result.articles, result.questions
    typer.echo(f"articles: {len(articles)} read, {a.inserted} new, {a.updated} updated (longer text), "
               f"{a.unchanged} unchanged")
    typer.echo(f"questions: {len(questions)} read, {q.inserted} new, {q.updated} updated, {q.unchanged} unchanged")
    if report.skipped:
        typer.echo(f"skipped {report.skipped_total} malformed or unusable record(s):")
        for reason, n in sorted(report.skipped.items(), key=lambda kv: -kv[1]):
            typer.echo(f"  {n:6d}  {reason}")
        for example in getattr(report, "examples", [])[:5]:
            typer.echo(f"          e.g. {example}")
    stale = result.stale_months
    if stale:
        typer.echo("already indexed months with new or longer articles (re-ingest them): "
                   + " ".join(f"sqa ingest --month {m}" for m in stale))


@import_cli.command("realtimeqa")
@_guard
def import_realtimeqa(path: Path = typer.Argument(..., help="RealTimeQA repository root or its past/ folder"),
                      since: Optional[str] = typer.Option(None, help="YYYY-MM-DD: skip questions and articles before"),
                      until: Optional[str] = typer.Option(None, help="YYYY-MM-DD: skip questions and articles after")) -> None:
    """Import RealTimeQA questions and their search-result articles (.jsonl or .jsonl.gz)."""
    from indexer.importers import read_realtimeqa

    if not path.exists():
        fail(f"{path} does not exist")
    articles, questions, report = read_realtimeqa(path, since=_day(since, "--since"), until=_day(until, "--until"))
    _store(articles, questions, report)


@import_cli.command("streamingqa")
@_guard
def import_streamingqa(questions_path: Path = typer.Argument(..., metavar="QUESTIONS.jsonl[.gz]"),
                       articles: Optional[Path] = typer.Option(None, "--articles", help="ARTICLES.jsonl[.gz]"),
                       since: Optional[str] = typer.Option(None), until: Optional[str] = typer.Option(None)) -> None:
    """Import StreamingQA questions (and a plain article JSONL)."""
    from indexer.importers import read_streamingqa

    for p in (questions_path, articles):
        if p is not None and not p.exists():
            fail(f"{p} does not exist")
    arts, questions, report = read_streamingqa(questions_path, articles, since=_day(since, "--since"),
                                               until=_day(until, "--until"))
    _store(arts, questions, report)


@import_cli.command("articles")
@_guard
def import_articles(path: Path, since: Optional[str] = typer.Option(None), until: Optional[str] = typer.Option(None),
                    source: str = typer.Option("jsonl", help="name stored with each article")) -> None:
    """Import plain article JSONL (id, url, title, text, published)."""
    from indexer.importers import read_articles_jsonl
    from indexer.records import ImportReport

    if not path.exists():
        fail(f"{path} does not exist")
    report = ImportReport()
    arts, report = read_articles_jsonl(path, since=_day(since, "--since"), until=_day(until, "--until"),
                                       report=report, source=source)
    _store(arts, [], report)


# ---- ingest ----------------------------------------------------------------------------------------

def _run_ingest(params: dict) -> None:
    from app.runtime import build_encoder, ingest_config, open_database
    from workers.ingest import ingest as run_ingest

    s = _settings()
    db = open_database(s)
    try:
        typer.echo(f"ingest: {json.dumps(params)}", err=True)
        job = run_ingest(db.sessions, build_encoder(s), ingest_config(s), params,
                         bar=_show_bar())
        typer.echo(f"ingest job {job.id} {job.state}", err=True)
        counts = job.counts or {}
        for key in counts.get("planned", []):
            c, t = counts.get(key, {}), (job.timings or {}).get(key, {})
            typer.echo(f"{key}: {c.get('articles')} articles -> {c.get('passages')} passages "
                       f"({t.get('passages_per_s')} passages/s), snapshot {c.get('snapshot')}")
        if counts.get("empty_months"):
            typer.echo(f"months without articles (skipped): {' '.join(counts['empty_months'])}")
        if not counts.get("planned"):
            typer.echo(job.message)
    finally:
        db.close()


@cli.command("ingest")
@_guard
def ingest(month: Optional[str] = typer.Option(None, help="YYYY-MM: (re-)ingest this month"),
           through: Optional[str] = typer.Option(None, help="YYYY-MM: ingest every month not yet ingested up to this one"),
           from_: Optional[str] = typer.Option(None, "--from", help="YYYY-MM: with --through, the first month "
                                               "(older articles form one history backfill on an empty index)"),
           history_before: Optional[str] = typer.Option(None, help="YYYY-MM: (re)build the history shard of "
                                                        "everything published before this month")) -> None:
    """Chunk, encode and index articles; each month becomes a shard and a new snapshot."""
    from indexer.dates import parse_month

    given = [x for x in (month, through, history_before) if x]
    if len(given) != 1:
        fail("give exactly one of --month, --through or --history-before")
    if from_ and not through:
        fail("--from goes with --through")
    for value in (month, through, from_, history_before):
        if value:
            parse_month(value)
    params = {"month": month} if month else {"history_before": history_before} if history_before else \
        {"through": through, **({"from": from_} if from_ else {})}
    _run_ingest(params)


@index_cli.command("rebuild")
@_guard
def index_rebuild() -> None:
    """Re-encode every shard of the newest snapshot from the database (after corruption or an encoder change)."""
    _run_ingest({"rebuild": True})


@index_cli.command("reencode")
@_guard
def index_reencode(encoder: str = typer.Option(..., help="the encoder to switch to: a trained version "
                                               "(`sqa encoders list`), minilm, or a folder")) -> None:
    """Re-encode every shard with another encoder and switch the index to it in one snapshot; run the
    same command again to resume an interrupted run."""
    _reencode(encoder)


def _reencode(spec: str) -> None:
    from app.runtime import ingest_config, open_database
    from models.encoders import load_encoder
    from workers.reencode import reencode

    s = _settings()
    try:
        enc = load_encoder(spec, device=s.device, encoders_dir=s.encoders_dir)
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
    db = open_database(s)
    try:
        job = reencode(db.sessions, enc, ingest_config(s), bar=_show_bar())
    finally:
        db.close()
    c, t = job.counts or {}, job.timings or {}
    if not c.get("snapshot"):
        typer.echo(job.message)
        return
    typer.echo(f"re-encoded {c['passages']} passages in {c['shards']} shards with {c['encoder']} "
               f"({t.get('passages_per_s')} passages/s); snapshot {c['snapshot']} serves")
    if s.encoder != "auto":
        typer.echo(f"SQA_ENCODER is pinned to {s.encoder}: set it to auto (or {c['encoder']}) so that the "
                   "server and the ingests use the new encoder")


@index_cli.command("status")
@_guard
def index_status() -> None:
    """Show the newest snapshot and check its files against the database."""
    from app.runtime import open_database
    from app.services.index_state import IndexState

    s = _settings()
    db = open_database(s)
    try:
        state = IndexState(db.sessions, s.index_dir, **_encoder_identity(s))
        if not state.refresh():
            fail("no index snapshot yet: run `sqa ingest --through YYYY-MM`", code=1)
        snap = state.current()
        typer.echo(f"snapshot {snap.snapshot_id}: {snap.index.ntotal} vectors, encoder {snap.manifest.encoder}, "
                   f"newest day {snap.newest_day}")
        for e in snap.manifest.shards:
            typer.echo(f"  {e.key:16s} {e.count:8d} vectors  {e.min_day}..{e.max_day}  {e.file}  {e.index.kind}  "
                       f"{e.encoder or snap.manifest.encoder}{'' if e.bm25 else '  (no BM25: sqa index bm25)'}")
        typer.echo("files and database agree")
    finally:
        db.close()


@index_cli.command("bm25")
@_guard
def index_bm25() -> None:
    """Build the BM25 files of shards ingested before BM25 existed (SQA_RETRIEVER=bm25|hybrid needs them)."""
    from app.runtime import open_database
    from workers.lexical import build_missing_lexical

    s = _settings()
    db = open_database(s)
    try:
        out = build_missing_lexical(db.sessions, s.index_dir)
    finally:
        db.close()
    if not out["built"]:
        typer.echo(f"every shard of snapshot {out['snapshot']} already has its BM25 index")
    else:
        typer.echo(f"BM25 for {', '.join(out['built'])} ({out['passages']} passages); snapshot {out['snapshot']}")


def _encoder_identity(s: Settings) -> dict:
    from app.runtime import build_encoder

    enc = build_encoder(s)
    return {"encoder": enc.name, "dim": enc.dim}


# ---- evaluation -----------------------------------------------------------------------------------

def _job_run(kind: str, params: dict, body, *, result_key: str = "eval_run"):
    """Record a job around `body(db, progress, job_id)`; returns what body returns (kept in the
    job's counts under `result_key`, beside what body recorded there)."""
    from app.db.base import utcnow
    from app.db.queries import create_job
    from app.db.tables import Job
    from app.runtime import open_database
    from workers.progress import JobProgress

    s = _settings()
    db = open_database(s)
    try:
        with db.sessions() as session, session.begin():
            job_id = create_job(session, kind, params).id
            job = session.get(Job, job_id)
            job.state, job.started_at, job.pid = "running", utcnow(), os.getpid()
        progress = JobProgress(db.sessions, job_id, bar=_show_bar())
        try:
            result = body(db, progress, job_id)
        except BaseException as exc:
            with db.sessions() as session, session.begin():
                job = session.get(Job, job_id)
                job.state, job.error, job.finished_at = "failed", str(exc) or type(exc).__name__, utcnow()
            raise
        finally:
            progress.close()
        with db.sessions() as session, session.begin():
            job = session.get(Job, job_id)
            job.state, job.progress, job.message, job.finished_at = "succeeded", 1.0, "done", utcnow()
            job.counts = {**(job.counts or {}), result_key: result}
        return result
    finally:
        db.close()


def _print_run(run_id: int) -> None:
    from app.db.tables import EvalRun
    from app.runtime import open_database

    db = open_database(_settings(), migrate=False)
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
            lags = ", ".join(f"{int(k):+d}Q {v:.3f}" for k, v in sorted(m["lag_table"].items(), key=lambda kv: int(kv[0]))
                             if v is not None)
            d, a = m["deterioration"], m["adaptation"]
            typer.echo(f"  {subset:8s} {metric:6s} lag: {lags}")
            if d.get("n_pairs") or a.get("n_pairs"):
                typer.echo(f"  {'':8s} {'':6s} DS {d.get('score')} (p={d.get('p_value')}, n={d.get('n_pairs')}); "
                           f"AS {a.get('score')} (p={a.get('p_value')}, n={a.get('n_pairs')})")


@cli.command("evaluate")
@_guard
def evaluate(quarter: str = typer.Option(..., help="YYYYQn: the question quarter, answered with the serving index"),
             max_questions: Optional[int] = typer.Option(None, help="questions the reader answers (default "
                                                         "SQA_EVAL_MAX_QUESTIONS; 0: all); recall covers all")) -> None:
    """Evaluate a quarter's questions (as of their own dates) against the serving index."""
    from app.runtime import build_answer_service, build_encoder, build_reader, eval_config
    from evaluation.temporal import quarter_bounds
    from workers.evaluate import evaluate_current

    quarter_bounds(quarter)
    s = _settings()
    cfg = eval_config(s, max_questions)

    def body(db, progress, job_id):
        service = build_answer_service(s, db, build_encoder(s), build_reader(s))
        return evaluate_current(db.sessions, service, quarter, cfg, s.reports_dir, job_id=job_id, progress=progress)

    _print_run(_job_run("evaluation", {"quarter": quarter, "max_questions": cfg.max_questions}, body))


@cli.command("replay")
@_guard
def replay(from_: str = typer.Option(..., "--from", help="YYYY-MM: the first month of the stream"),
           to: str = typer.Option(..., "--to", help="YYYY-MM: the last month"),
           max_questions: Optional[int] = typer.Option(None, help="questions per quarter the reader answers "
                                                       "(default SQA_EVAL_MAX_QUESTIONS; 0: all)")) -> None:
    """Replay the stream: ingest month by month, keep quarter-end states, evaluate the temporal grid."""
    from app.runtime import build_answer_service, build_encoder, build_reader, eval_config, ingest_config
    from indexer.dates import parse_month
    from workers.replay import ReplayPlan, run_replay

    if parse_month(from_) > parse_month(to):
        fail(f"--from {from_} is after --to {to}")
    s = _settings()
    cfg = eval_config(s, max_questions)
    plan = ReplayPlan(from_, to)

    def body(db, progress, job_id):
        service = build_answer_service(s, db, build_encoder(s), build_reader(s))
        return run_replay(db.sessions, service, ingest_config(s), plan, cfg, s.reports_dir, job_id=job_id,
                          progress=progress, bar=_show_bar())

    _print_run(_job_run("replay", {"from": from_, "to": to, "max_questions": cfg.max_questions}, body))


def _print_estimate(result: dict) -> None:
    c = result["counts"]
    typer.echo(f"pool {', '.join(result['config']['pool'])}: {c['pool']} questions; new sample "
               f"{result['config']['new']}: {c['new']} questions (F1 in points; learner: candidate ranker, "
               f"baseline: the majority training answer)")
    typer.echo(f"{'split':12s} {'splits':>6s} {'n_test':>6s} {'estimate':>8s} {'std':>6s} {'min':>6s} {'max':>6s} "
               f"{'baseline':>8s} {'err.red':>7s} {'vs new':>7s}")
    for r in result["table"]:
        typer.echo(f"{r['strategy']:12s} {r['splits']:6d} {r['n_test']:6d} {r['estimate']:8.2f} {r['std']:6.2f} "
                   f"{r['min']:6.2f} {r['max']:6.2f} {r['baseline']:8.2f} {100 * r['error_reduction']:6.1f}% "
                   f"{r['diff_from_temporal']:+7.2f}")


@cli.command("estimate")
@_guard
def estimate(pool: str = typer.Option(..., help="question quarters to estimate from: 2022Q3,2022Q4 or 2022Q3..2023Q1"),
             split: str = typer.Option("all", help="random | length | adversarial | temporal | all (comma-separated)"),
             new: Optional[str] = typer.Option(None, help="YYYYQn: the new sample for the temporal split "
                                               "(default: the quarter after the pool)"),
             k: int = typer.Option(5, help="repeats of the random and adversarial splits"),
             test_fraction: float = typer.Option(0.1, help="share of the pool held out"),
             passages: int = typer.Option(10, min=1, max=50, help="retrieved passages per question"),
             seed: int = typer.Option(0),
             out: Optional[Path] = typer.Option(None, help="also write the result as JSON here")) -> None:
    """Estimate performance on new questions from a pool, under random, length, adversarial and temporal splits."""
    from evaluation.splits import STRATEGIES
    from evaluation.temporal import quarter_index, shift_quarter
    from workers.estimate import EstimateConfig, parse_pool, run_estimate

    quarters = parse_pool(pool)
    if not quarters:
        fail("--pool names no quarter (e.g. --pool 2022Q3,2022Q4)")
    strategies = STRATEGIES if split.strip() == "all" else tuple(x.strip() for x in split.split(",") if x.strip())
    last = max(quarters, key=quarter_index)
    cfg = EstimateConfig(pool=quarters, new=new or shift_quarter(last, 1),
                         strategies=strategies, k=k, test_fraction=test_fraction, passages=passages, seed=seed)
    s = _settings()
    result = _job_run("estimate", {"pool": list(quarters), "new": cfg.new, "split": list(strategies)},
                      lambda db, progress, job_id: run_estimate(s, db, cfg, progress), result_key="estimate")
    _print_estimate(result)
    if out is not None:
        out.write_text(json.dumps(result, indent=2))
        typer.echo(f"written to {out}")


def _f(value, digits: int = 2, sign: bool = False) -> str:
    if value is None or value != value:  # None or NaN
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def _print_transport(version: str, t: dict) -> None:
    tr = t["transport"]
    typer.echo(f"{version}: source {t['source']} (F1 {_f(tr['source_score'])}), tau_p mean {_f(tr['tau_p_mean'], 3)}, "
               f"tau_var {_f(tr['tau_var'], 3)} over {tr['n']} quarter(s); drift measure {t['measure']}")
    typer.echo(f"  {'quarter':8s} {'n':>5s} {'F1':>6s} {'tau_p':>6s}")
    for q, row in t["quarters"].items():
        typer.echo(f"  {q:8s} {row['n']:5d} {_f(row['f1']):>6s} {_f(tr['tau_p'].get(q), 3):>6s}")
    typer.echo(f"  {'month':8s} {'n':>5s} {'F1':>6s} " + " ".join(f"{k:>10s}" for k in t["months"][0]
                                                                  if k not in ("month", "quarter", "f1", "n")))
    for m in t["months"]:
        typer.echo(f"  {m['month']:8s} {m['n']:5d} {_f(m['f1']):>6s} " + " ".join(
            f"{_f(v, 4):>10s}" for k, v in m.items() if k not in ("month", "quarter", "f1", "n")))
    typer.echo(f"  {'predict':8s} {'drift':>8s} {'pred F1':>8s} {'actual':>7s} {'error':>7s} {'naive':>7s} {'n.err':>7s}")
    for r in t["predictions"]:
        typer.echo(f"  {r['quarter']:8s} {_f(r['drift'], 4):>8s} {_f(r['predicted_f1']):>8s} {_f(r['actual_f1']):>7s} "
                   f"{_f(r['error'], sign=True):>7s} {_f(r['naive_f1']):>7s} {_f(r['naive_error'], sign=True):>7s}")
    typer.echo(f"  mean |error|: regression {_f(t['mean_abs_error'])}, no-change forecast {_f(t['naive_mean_abs_error'])}")


@cli.command("transport")
@_guard
def transport(version: Optional[str] = typer.Option(None, help="the version to report (\"<reader> @ <encoder>\"; "
                                                    "default: every evaluated version)"),
              measure: str = typer.Option("cosine", help="drift measure for the regression: cosine | kl | "
                                          "unseen_words | unseen_words_tokens | unseen_entities | ..."),
              source: Optional[str] = typer.Option(None, help="YYYYQn: the source quarter (default: the first evaluated)"),
              out: Optional[Path] = typer.Option(None, help="also write the result as JSON here")) -> None:
    """Transportability (tau_p, tau_var) per version and predicted against actual F1 per quarter."""
    from app.runtime import open_database
    from app.runtime import transport_config
    from workers.transport import month_scores, profile_loader, transport_summary

    s = _settings()
    db = open_database(s)
    try:
        with db.sessions() as session:
            scores = month_scores(session)
            if version is not None and version not in scores:
                fail(f"no evaluated questions for version {version!r} (have: {', '.join(sorted(scores)) or 'none'})")
            load = profile_loader(session, transport_config(s))
            results = {v: transport_summary(sc, load, measure=measure, source=source)
                       for v, sc in sorted(scores.items()) if version is None or v == version}
    finally:
        db.close()
    if not results:
        fail("no evaluation results yet: run `sqa evaluate --quarter YYYYQn` for two or more quarters")
    for v, t in results.items():
        _print_transport(v, t)
    if out is not None:
        out.write_text(json.dumps(results, indent=2, default=str))
        typer.echo(f"written to {out}")


@cli.command("report")
@_guard
def report(run_id: int, out: Path = typer.Option(..., "--out", help="folder for report.html, PNGs, summary.json")) -> None:
    """Write an evaluation run's HTML report, plots and JSON summary (recomputed from stored results)."""
    from app.db.tables import EvalRun
    from app.runtime import eval_config, open_database
    from workers.evaluate import render_report

    s = _settings()
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


# ---- trained readers ------------------------------------------------------------------------------

train_cli = typer.Typer(no_args_is_help=True, help="Train models on what is dated before a cut.")
cli.add_typer(train_cli, name="train")


def _reader_spec(kind: str, max_minutes: float, epochs: int, n_passages: int | None, base: Optional[str], seed: int):
    from workers.train import ReaderJobSpec

    if kind not in ("fid", "extractive", "ranker"):
        fail(f"--kind {kind!r} is unknown (use fid, extractive or ranker)")
    if kind == "ranker":  # reads the same number of passages in training and serving
        from workers.train_ranker import PASSAGES, SELF_ARTICLES

        n = n_passages or PASSAGES
        return ReaderJobSpec(kind=kind, n_passages=n, infer_passages=n, max_self_articles=SELF_ARTICLES, seed=seed)
    if base and not Path(base).is_dir():
        fail(f"--base {base} is not a folder (a local T5/BART checkpoint is expected)")
    return ReaderJobSpec(kind=kind, max_minutes=max_minutes, max_epochs=epochs, n_passages=n_passages or 5,
                         backbone="seq2seq" if base else "minilm", base=base or "", seed=seed)


@train_cli.command("reader")
@_guard
def train_reader(until: str = typer.Option(..., help="YYYY-MM-DD: train on what is dated before this day"),
                 kind: str = typer.Option("ranker", help="ranker | extractive | fid (ranker: an entity ranker that "
                                                              "fits in seconds, measures best on this machine)"),
                 base: Optional[str] = typer.Option(None, help="fid: a local T5/BART folder (default: warm start "
                                                               "from the packaged MiniLM)"),
                 max_minutes: float = typer.Option(0.0, help="wall-clock budget (0: none); the best checkpoint is kept"),
                 epochs: int = typer.Option(3, min=1),
                 n_passages: Optional[int] = typer.Option(None, min=1, max=100, help="passages per training "
                                                          "question (default 5; ranker: 10, also when serving)"),
                 seed: int = typer.Option(0), activate: bool = typer.Option(
                     False, "--activate/--no-activate", help="make it the active version when done")
                 ) -> None:
    """Train a reader version; run the same command again to resume an interrupted run."""
    from workers.train import run_train_job

    day = _day(until, "--until")
    spec = _reader_spec(kind, max_minutes, epochs, n_passages, base, seed)
    version = _job_run("train", {"until": str(day), "kind": kind},
                       lambda db, progress, job_id: run_train_job(_settings(), job_id, until=day, spec=spec,
                                                                  activate=activate, progress=progress),
                       result_key="version")
    typer.echo(f"reader version {version} trained; `sqa models list` shows it")


@train_cli.command("retriever")
@_guard
def train_retriever(until: str = typer.Option(..., help="YYYY-MM-DD: train on what is dated before this day"),
                    towers: str = typer.Option("shared", help="shared (one encoder for questions and passages) | "
                                                              "separate (a question tower and a passage tower)"),
                    epochs: int = typer.Option(1, min=1),
                    batch_size: int = typer.Option(16, min=2, help="questions a step (in-batch negatives; larger "
                                                                   "is better where there is a GPU)"),
                    lr: float = typer.Option(2e-5, min=0.0),
                    max_minutes: float = typer.Option(0.0, min=0.0, help="wall-clock budget (0: none); the best "
                                                                         "validated state is kept"),
                    self_articles: int = typer.Option(1500, min=0, help="articles sampled for self-labeled questions"),
                    self_ratio: float = typer.Option(2.0, min=0.0, help="self-labeled pairs kept per gold pair"),
                    hard_negatives: bool = typer.Option(True, "--hard-negatives/--no-hard-negatives",
                                                        help="add each question's best BM25 passage without the answer"),
                    seed: int = typer.Option(0),
                    switch: bool = typer.Option(False, "--switch/--no-switch", help="re-encode the index with the new "
                                                "version when done (`sqa index reencode`)")) -> None:
    """Fine-tune the question and passage encoders (DPR) and save them as an encoder version;
    run the same command again to resume an interrupted run."""
    from models.dpr import DprConfig
    from models.encoders import read_encoder_info
    from workers.train_retriever import RetrieverDataConfig, describe, run_train_retriever_job

    day = _day(until, "--until")
    try:
        cfg = DprConfig(towers=towers, epochs=epochs, batch_size=batch_size, lr=lr, max_minutes=max_minutes,
                        hard_negatives=hard_negatives, seed=seed)
    except ValueError as exc:
        fail(str(exc))
    data = RetrieverDataConfig(max_self_articles=self_articles, max_self_ratio=self_ratio, seed=seed)
    version = _job_run("train-retriever", {"until": str(day), "towers": towers},
                       lambda db, progress, job_id: run_train_retriever_job(_settings(), job_id, until=day, cfg=cfg,
                                                                            data=data, progress=progress),
                       result_key="version")
    typer.echo(f"encoder version {version} trained; validation (gold questions of the month before the cut, "
               "pooled BM25 + dense candidates):")
    typer.echo(describe(read_encoder_info(_settings().encoders_dir / version)))
    if switch:
        _reencode(version)
    else:
        typer.echo(f"switch the index to it with `sqa index reencode --encoder {version}`")


encoders_cli = typer.Typer(no_args_is_help=True, help="Retriever encoder versions (`sqa train retriever`).")
cli.add_typer(encoders_cli, name="encoders")


@encoders_cli.command("list")
@_guard
def encoders_list() -> None:
    """Trained encoder versions with their validation figures; * marks the one the index uses."""
    from app.runtime import index_encoder_name
    from models.encoders import list_encoder_versions

    s = _settings()
    serving = index_encoder_name(s)
    typer.echo(f"{'*' if serving == 'all-MiniLM-L6-v2' else ' '} all-MiniLM-L6-v2  (packaged, untuned)")
    for info in list_encoder_versions(s.encoders_dir):
        best = info.get("validation", {}).get("best", {})
        typer.echo(f"{'*' if serving == info['version'] else ' '} {info['version']}  towers {info.get('towers')}  "
                   f"trained until {info.get('trained_until')}  validation recall@5 {best.get('recall@5')} "
                   f"recall@20 {best.get('recall@20')}")
    if serving is None:
        typer.echo("(no index yet)")


@cli.command("finetune")
@_guard
def finetune(month: str = typer.Option(..., help="YYYY-MM: fine-tune the active reader on this month's news"),
             max_minutes: float = typer.Option(0.0, help="wall-clock budget (0: none)")) -> None:
    """Continue the active reader on the month's self-labeled questions plus a replay sample of
    older ones; the new version becomes active."""
    from indexer.dates import parse_month
    from workers.train import run_finetune_job

    parse_month(month)
    version = _job_run("finetune", {"month": month},
                       lambda db, progress, job_id: run_finetune_job(_settings(), job_id, month=month,
                                                                     progress=progress, max_minutes=max_minutes),
                       result_key="version")
    typer.echo(f"reader version {version} fine-tuned on {month} and activated")


@cli.command("worker")
@_guard
def worker() -> None:
    """Run the scheduler process: monthly ingest and quarterly evaluation (never inside the web server)."""
    from workers.scheduler import run_worker

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_worker(_settings())


@cli.command("schedule")
@_guard
def schedule(run: Optional[str] = typer.Option(None, help="run this scheduled job now (monthly-ingest, "
                                               "quarterly-evaluation)"),
             period: Optional[str] = typer.Option(None, help="with --run: the month (YYYY-MM) or quarter (YYYYQn)")) -> None:
    """List the scheduled jobs and their next runs, or run one now."""
    from workers.scheduler import scheduled_jobs, trigger_now

    if run:
        typer.echo(json.dumps(trigger_now(run, period), default=str, indent=2))
        return
    jobs = scheduled_jobs(_settings())
    if not jobs:
        typer.echo("no jobs scheduled yet: `sqa worker` registers them when it first starts")
    for j in jobs:
        typer.echo(f"{j['id']:22s} next {j.get('next_run_time')}  ({j.get('trigger')})")


# ---- ask, serve, jobs ------------------------------------------------------------------------------

@cli.command("ask")
@_guard
def ask(question: str, as_of: Optional[str] = typer.Option(None, help="YYYY-MM-DD (default: today)"),
        top_k: Optional[int] = typer.Option(None), as_json: bool = typer.Option(False, "--json")) -> None:
    """Answer one question as of a date and print the cited passages."""
    from app.runtime import build_answer_service, build_encoder, build_reader, open_database

    s = _settings()
    day = _day(as_of, "--as-of")
    db = open_database(s)
    try:
        service = build_answer_service(s, db, build_encoder(s), build_reader(s))
        service.index_state.refresh()
        result = service.answer(question, day, top_k)
    finally:
        db.close()
    if as_json:
        from dataclasses import asdict

        typer.echo(json.dumps(asdict(result), default=str, indent=2))
        return
    typer.echo(f"Q ({result.as_of}): {question}")
    typer.echo(f"A: {result.answer or '(no answer)'}")
    for note in result.notes:
        typer.echo(f"note: {note}")
    for i, p in enumerate(result.passages, 1):
        typer.echo(f"  [{i}] {p.published}  {p.score:.3f}  {p.title[:80]}\n      {p.url}\n      {p.text[:200]}…")


@cli.command("serve")
def serve(host: str = typer.Option("127.0.0.1"), port: int = typer.Option(8000),
          log_level: str = typer.Option("info")) -> None:
    """Run the HTTP API under uvicorn (one process: the models load once)."""
    import uvicorn

    from app.main import create_app

    s = _settings()
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(s), host=host, port=port, log_level=log_level)


@jobs_cli.command("show")
@_guard
def jobs_show(job_id: int) -> None:
    """Show one job as JSON."""
    from app.db.tables import Job
    from app.runtime import open_database

    db = open_database(_settings())
    try:
        with db.sessions() as session:
            job = session.get(Job, job_id)
            if job is None:
                fail(f"no job with id {job_id}")
            typer.echo(json.dumps({c.name: getattr(job, c.name) for c in Job.__table__.columns}, default=str, indent=2))
    finally:
        db.close()


# ---- models: trained reader versions ----------------------------------------------------------------

models_cli = typer.Typer(no_args_is_help=True, help="Trained reader versions (the registry).")
cli.add_typer(models_cli, name="models")


@models_cli.command("list")
@_guard
def models_list() -> None:
    """Every trained reader version, newest first; * marks the active one."""
    from app.runtime import open_database
    from app.services.reader_registry import list_versions

    db = open_database(_settings())
    try:
        with db.sessions() as session:
            rows = list_versions(session)
            if not rows:
                typer.echo("no trained reader versions yet: run `sqa train reader --until YYYY-MM-DD`")
                return
            typer.echo(f"  {'version':40s} {'kind':10s} {'state':9s} {'trained until':13s} {'month':7s} parent")
            for r in rows:
                typer.echo(f"{'*' if r.active else ' '} {r.version:40s} {r.kind:10s} {r.state:9s} "
                           f"{str(r.trained_until or '-'):13s} {r.month or '-':7s} {r.parent_version or '-'}")
    finally:
        db.close()


@models_cli.command("activate")
@_guard
def models_activate(version: str) -> None:
    """Make a ready version the active one (servers with SQA_READER=auto switch to it)."""
    from app.runtime import open_database
    from app.services.reader_registry import activate_version

    s = _settings()
    db = open_database(s)
    try:
        with db.sessions() as session, session.begin():
            activate_version(session, version, models_dir=s.models_dir)  # unknown / not ready: exit 2
    finally:
        db.close()
    typer.echo(f"activated reader version {version}; servers with SQA_READER=auto serve it within "
               f"SQA_SNAPSHOT_POLL_S ({s.snapshot_poll_s:g} s)")


@cli.command("selflabel")
@_guard
def selflabel(month: Optional[str] = typer.Option(None, help="YYYY-MM: articles published in this month"),
              until: Optional[str] = typer.Option(None, help="YYYY-MM-DD: articles published before this day"),
              n: int = typer.Option(30, help="how many generated questions to print"),
              seed: int = typer.Option(0, help="the same seed prints the same questions"),
              max_articles: int = typer.Option(200, help="generate from this many random articles")) -> None:
    """Print self-labeled questions generated from random stored articles, and why others were rejected."""
    from app.runtime import open_database
    from indexer.dates import parse_month
    from models.selflabel import RULES, sample_from_database

    if month and until:
        fail("give at most one of --month or --until")
    if month:
        parse_month(month)
    day = _day(until, "--until")
    db = open_database(_settings(), migrate=False)  # read only: never migrates someone's database
    try:
        with db.sessions() as session:
            questions, stats = sample_from_database(session, until=day, month=month, n=n, seed=seed,
                                                    max_articles=max_articles)
    finally:
        db.close()
    for q in questions:
        typer.echo(f"{q.published} | {q.question} | {q.answer} ({q.answer_label})")
    typer.echo(f"articles {stats.articles}, sentences {stats.sentences}, candidate entities {stats.candidates}, "
               f"accepted {stats.accepted}")
    for reason, count in sorted(stats.rejected.items(), key=lambda kv: -kv[1]):
        typer.echo(f"  rejected {count:6d}  {reason}: {RULES[reason]}")


# ---- drift of each month --------------------------------------------------------------------------

def _print_drift(rows: list[dict]) -> None:
    from evaluation.drift import DRIFT_MEASURES

    measures = [m for m in DRIFT_MEASURES if any(m in r["measures"] for r in rows)]
    typer.echo(f"{'month':7s}  {'reference':9s}  {'months':16s}  {'n':>6s}  {'n_ref':>7s}  "
               + "  ".join(f"{m:>{max(len(m), 8)}s}" for m in measures))
    for r in rows:
        span = r["reference_first"] if r["reference_first"] == r["reference_last"] else \
            f"{r['reference_first']}..{r['reference_last']}"
        values = "  ".join(f"{r['measures'][m]:>{max(len(m), 8)}.4f}" if m in r["measures"] else
                           f"{'-':>{max(len(m), 8)}s}" for m in measures)
        typer.echo(f"{r['month']:7s}  {r['reference']:9s}  {span:16s}  {r['n_target']:6d}  {r['n_source']:7d}  "
                   f"{values}")


@cli.command("drift")
@_guard
def drift(month: Optional[str] = typer.Option(None, help="YYYY-MM: this month only"),
          from_: Optional[str] = typer.Option(None, "--from", help="YYYY-MM: the first month (default: the "
                                              "first ingested)"),
          to: Optional[str] = typer.Option(None, help="YYYY-MM: the last month (default: the last ingested)"),
          features: Optional[str] = typer.Option(None, help="words and/or entities, comma-separated "
                                                 "(default SQA_DRIFT_FEATURES; entities are slow)"),
          recompute: bool = typer.Option(False, "--recompute", help="rebuild the month profiles and replace "
                                         "rows that are up to date")) -> None:
    """Compute (backfill) each ingested month's drift from the previous, earlier and training months."""
    import dataclasses

    from app.runtime import drift_config, open_database
    from evaluation.drift import parse_features
    from indexer.dates import month_key, parse_month
    from workers.drift import backfill_drift

    if month and (from_ or to):
        fail("give --month, or --from/--to, not both")
    first = last = month_key(parse_month(month)) if month else None
    if not month:
        first = month_key(parse_month(from_)) if from_ else None
        last = month_key(parse_month(to)) if to else None
        if first and last and first > last:
            fail(f"--from {first} is after --to {last}")
    s = _settings()
    cfg = drift_config(s)
    if features is not None:
        cfg = dataclasses.replace(cfg, features=parse_features(features))
    bar = _show_bar()

    def progress(m: str, done: int, total: int) -> None:  # entities only: spaCy is the slow part
        if bar:
            typer.echo(f"\rentities of {m}: {done}/{total}", err=True, nl=done >= total)

    db = open_database(s)
    try:
        rows = backfill_drift(db.sessions, s.index_dir, cfg, first=first, last=last, recompute=recompute,
                              progress=progress)
    finally:
        db.close()
    if not rows:
        typer.echo("no drift to show: the first ingested month has no earlier month (and no trained reader is active)")
        return
    _print_drift(rows)


def main() -> None:
    cli()


if __name__ == "__main__":
    main()
