"""`sqa db`, `sqa import`, `sqa ingest` and `sqa index`: getting news into the index."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import typer

from app.cli.common import cli, context, day_option, fail, guard, month_option, open_database, settings
from indexer.dates import month_key, month_start
from indexer.importers import read_articles_jsonl, read_realtimeqa, read_streamingqa
from indexer.records import ImportReport

db_cli = typer.Typer(no_args_is_help=True, help="Database schema.")
import_cli = typer.Typer(no_args_is_help=True, help="Import articles and questions.")
index_cli = typer.Typer(no_args_is_help=True, help="Index snapshots.")
cli.add_typer(db_cli, name="db")
cli.add_typer(import_cli, name="import")
cli.add_typer(index_cli, name="index")


# ---- db --------------------------------------------------------------------------------------------


@db_cli.command("upgrade", epilog="Example: sqa db upgrade")
@guard
def db_upgrade() -> None:
    """Apply the database migrations (also done automatically on start)."""
    from store.migrate import upgrade  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: alembic)

    s = settings()
    s.ensure_dirs()
    upgrade(s.db_url)
    typer.echo(f"database at {s.db_url.split('@')[-1]} is at the newest schema")


# ---- import ----------------------------------------------------------------------------------------


def _store(articles, questions, report) -> None:
    from workers.imports import store_records  # noqa: PLC0415 (lazy: faiss)

    db = open_database(settings())
    try:
        result = store_records(db.sessions, articles, questions)
    finally:
        db.close()
    a, q = result.articles, result.questions
    typer.echo(
        f"articles: {len(articles)} read, {a.inserted} new, {a.updated} updated (longer text), {a.unchanged} unchanged"
    )
    typer.echo(f"questions: {len(questions)} read, {q.inserted} new, {q.updated} updated, {q.unchanged} unchanged")
    if report.skipped:
        typer.echo(f"skipped {report.skipped_total} malformed or unusable record(s):")
        for reason, n in sorted(report.skipped.items(), key=lambda kv: -kv[1]):
            typer.echo(f"  {n:6d}  {reason}")
        for example in getattr(report, "examples", [])[:5]:
            typer.echo(f"          e.g. {example}")
    stale = result.stale_months
    if stale:
        typer.echo(
            "already indexed months with new or longer articles (re-ingest them): "
            + " ".join(f"sqa ingest --month {m}" for m in stale)
        )


@import_cli.command("realtimeqa", epilog="Example: sqa import realtimeqa ../shared/data/realtimeqa --since 2023-01-01")
@guard
def import_realtimeqa(
    path: Path = typer.Argument(..., help="RealTimeQA repository root or its past/ folder"),
    since: str | None = typer.Option(None, help="YYYY-MM-DD: skip questions and articles before"),
    until: str | None = typer.Option(None, help="YYYY-MM-DD: skip questions and articles after"),
) -> None:
    """Import RealTimeQA questions and their search-result articles (.jsonl or .jsonl.gz)."""
    if not path.exists():
        fail(f"{path} does not exist")
    articles, questions, report = read_realtimeqa(
        path, since=day_option(since, "--since"), until=day_option(until, "--until")
    )
    _store(articles, questions, report)


@import_cli.command(
    "streamingqa", epilog="Example: sqa import streamingqa streaming_qa_valid.jsonl.gz --articles wmt_articles.jsonl.gz"
)
@guard
def import_streamingqa(
    questions_path: Path = typer.Argument(..., metavar="QUESTIONS.jsonl[.gz]"),
    articles: Path | None = typer.Option(None, "--articles", help="ARTICLES.jsonl[.gz]"),
    since: str | None = typer.Option(None),
    until: str | None = typer.Option(None),
) -> None:
    """Import StreamingQA questions (and a plain article JSONL)."""
    for p in (questions_path, articles):
        if p is not None and not p.exists():
            fail(f"{p} does not exist")
    arts, questions, report = read_streamingqa(
        questions_path, articles, since=day_option(since, "--since"), until=day_option(until, "--until")
    )
    _store(arts, questions, report)


@import_cli.command("articles", epilog="Example: sqa import articles news-2024-02.jsonl --source wire")
@guard
def import_articles(
    path: Path,
    since: str | None = typer.Option(None),
    until: str | None = typer.Option(None),
    source: str = typer.Option("jsonl", help="name stored with each article"),
) -> None:
    """Import plain article JSONL (id, url, title, text, published)."""
    if not path.exists():
        fail(f"{path} does not exist")
    report = ImportReport()
    arts, report = read_articles_jsonl(
        path, since=day_option(since, "--since"), until=day_option(until, "--until"), report=report, source=source
    )
    _store(arts, [], report)


# ---- ingest ----------------------------------------------------------------------------------------


def _fill_on_ray(ctx, encoder, params, address: str | None, actors: int) -> None:
    """Encode the planned months' passages on Ray into the ingest's checkpoints (workers/backfill_ray.py),
    under the index's ingest lock; the ingest that follows finds them encoded."""
    from tqdm import tqdm  # noqa: PLC0415 (lazy: keeps `sqa --help` fast)

    try:
        import ray  # noqa: F401, PLC0415 (lazy: ray, an optional extra)
    except ImportError:
        fail("--executor ray needs Ray: pip install '.[ray]'")
    from workers.backfill_ray import fill_checkpoints  # noqa: PLC0415 (lazy: faiss)
    from workers.ingest import ingest_lock  # noqa: PLC0415 (lazy: faiss)

    with ingest_lock(ctx.ingest.index_dir).hold(), tqdm(desc="encode on ray", unit="passage", disable=None) as bar:
        done = fill_checkpoints(
            ctx.sessions, encoder, ctx.ingest, params, address=address, actors=actors, advance=bar.update
        )
    typer.echo(
        f"ray: {done['encoded']} of {done['passages']} planned passages encoded now "
        f"({done['blocks']} blocks on {done['actors']} actors; the rest were already checkpointed)",
        err=True,
    )


def _run_ingest(
    params,
    *,
    train: bool = False,
    train_minutes: float | None = None,
    executor: str = "local",
    address: str | None = None,
    actors: int = 0,
) -> None:
    """Run an ingest job (`workers.ingest_plans.IngestParams`) here, print what each shard got, then train
    after it as the scheduler and the API do (`workers.after_ingest.train_after_ingest`: SQA_AUTO_TRAIN on
    what is dated before the last ingested month, then SQA_FINETUNE_POLICY) unless told not to."""
    from sqlalchemy import func, select  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: sqlalchemy)

    from store.tables import Passage  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: sqlalchemy)
    from workers.after_ingest import train_after_ingest  # noqa: PLC0415 (lazy: faiss)
    from workers.ingest import ingest as run_ingest  # noqa: PLC0415 (lazy: faiss)

    with context() as ctx:
        typer.echo(f"ingest: {json.dumps(params.to_json())}", err=True)
        encoder = ctx.load_encoder()
        if executor == "ray":
            _fill_on_ray(ctx, encoder, params, address, actors)
        job = run_ingest(ctx.sessions, encoder, ctx.ingest, params, runner=ctx.runner)
        typer.echo(f"ingest job {job.id} {job.state}", err=True)
        counts = job.counts or {}
        for key in counts.get("planned", []):
            c, t = counts.get(key, {}), (job.timings or {}).get(key, {})
            typer.echo(
                f"{key}: {c.get('articles')} articles -> {c.get('passages')} passages "
                f"({t.get('passages_per_s')} passages/s), snapshot {c.get('snapshot')}"
            )
        if counts.get("empty_months"):
            typer.echo(f"months without articles (skipped): {' '.join(counts['empty_months'])}")
        if not counts.get("planned"):
            typer.echo(job.message)
        last = params.month or params.through
        if last is None:  # a history backfill: no month of news to learn up to
            return
        with ctx.sessions() as session:  # the last ingested month: one that holds passages
            newest = session.scalar(select(func.max(Passage.published)))
        done = train_after_ingest(
            ctx,
            last if newest is None else min(last, month_start(newest)),
            indexed=newest is not None,
            train=train,
            train_minutes=train_minutes,
            keep_going=False,
            on_train=_say_training,
        )
        report_training(done)


def _say_training(until, cfg) -> None:
    """Say what is coming before an auto-train job starts: it takes a while."""
    typer.echo(
        f"training after ingest: on what is dated before {until}, checked on "
        f"{month_key(until - timedelta(days=1))} ({'a re-ranker, then ' if cfg.rerank else ''}the reader "
        f"within {cfg.max_minutes:g} min; --no-train skips it)",
        err=True,
    )


def report_training(done: dict) -> None:
    """Print what `workers.after_ingest.train_after_ingest` did: auto-train, then the fine-tune policy."""
    from workers.auto_train import describe  # noqa: PLC0415 (lazy: faiss)

    auto = done["auto_train"]
    if auto["action"] == "off":
        typer.echo("training after ingest: off (--no-train or SQA_AUTO_TRAIN=false)", err=True)
    elif auto["action"] == "skip" and "job_id" not in auto:
        typer.echo(f"training after ingest: skipped ({auto['reason']})", err=True)
    else:
        typer.echo(f"training after ingest: {describe(auto)}")
    tune = done["finetune"]
    if tune["policy"] == "never":
        return
    head = f"fine-tune after ingest (SQA_FINETUNE_POLICY={tune['policy']})"
    if not tune["ran"]:
        typer.echo(f"{head}: skipped ({tune['reason']})", err=True)
    elif "error" in tune:
        typer.echo(f"{head}: job {tune['job_id']} failed: {tune['error']}", err=True)
    else:
        typer.echo(f"{head}: version {tune['version']} (job {tune['job_id']})")


def run_auto_train(ctx, until, cfg) -> None:
    """`sqa train auto`: the auto-train step alone, whatever SQA_AUTO_TRAIN says, and print what happened."""
    from workers.auto_train import nothing_to_do, run_after_ingest  # noqa: PLC0415 (lazy: faiss)

    if nothing_to_do(ctx, until, cfg) is None:
        _say_training(until, cfg)
    report_training({"auto_train": run_after_ingest(ctx, until, cfg), "finetune": {"policy": "never"}})


@cli.command("ingest", epilog="Example: sqa ingest --through 2023-06 --from 2022-06 --no-train")
@guard
def ingest(
    month: str | None = typer.Option(None, help="YYYY-MM: (re-)ingest this month"),
    through: str | None = typer.Option(None, help="YYYY-MM: ingest every month not yet ingested up to this one"),
    from_: str | None = typer.Option(
        None,
        "--from",
        help="YYYY-MM: with --through, the first month (older articles form one history backfill on an empty index)",
    ),
    history_before: str | None = typer.Option(
        None, help="YYYY-MM: (re)build the history shard of everything published before this month"
    ),
    train: bool = typer.Option(
        True,
        "--train/--no-train",
        help="then train the reader on what is dated "
        "before the last ingested month, and activate it if it answers better on the "
        "month before (default: SQA_AUTO_TRAIN)",
    ),
    train_minutes: float | None = typer.Option(
        None, min=0.1, help="that training's budget in minutes (default: SQA_AUTO_TRAIN_MINUTES, 30)"
    ),
    executor: str = typer.Option(
        "local",
        help="local, or ray: encode every planned month in parallel on a "
        "Ray cluster first (pip install '.[ray]'), then index as local does",
    ),
    address: str | None = typer.Option(
        None, help="--executor ray: the cluster (ray://HOST:10001, auto); default: a local one on this machine's cores"
    ),
    actors: int = typer.Option(0, min=0, help="--executor ray: encoder actors (0: one per GPU, else per CPU)"),
) -> None:
    """Chunk, encode and index articles; each month becomes a shard and a new snapshot.

    Then, unless --no-train, the reader is trained on the stored questions and news dated before the
    last ingested month and becomes the served default only if it answers better than the serving
    reader on the month before it (a job of its own, resumable: run the same command again).
    """
    from workers.ingest_plans import IngestParams  # noqa: PLC0415 (lazy: faiss)

    given = [x for x in (month, through, history_before) if x]
    if len(given) != 1:
        fail("give exactly one of --month, --through or --history-before")
    if from_ and not through:
        fail("--from goes with --through")
    if executor not in ("local", "ray"):
        fail(f"--executor must be local or ray, not {executor!r}")
    if executor == "local" and (address or actors):
        fail("--address and --actors go with --executor ray")
    _run_ingest(
        IngestParams(
            month=month_option(month, "--month"),
            through=month_option(through, "--through"),
            start=month_option(from_, "--from"),
            history_before=month_option(history_before, "--history-before"),
        ),
        train=train,
        train_minutes=train_minutes,
        executor=executor,
        address=address,
        actors=actors,
    )


@index_cli.command("rebuild", epilog="Example: sqa index rebuild")
@guard
def index_rebuild() -> None:
    """Re-encode every shard of the newest snapshot from the database (after corruption or an encoder change)."""
    from workers.ingest_plans import IngestParams  # noqa: PLC0415 (lazy: faiss)

    _run_ingest(IngestParams(rebuild=True))


@index_cli.command("reencode", epilog="Example: sqa index reencode --encoder minilm")
@guard
def index_reencode(
    encoder: str = typer.Option(
        ..., help="the encoder to switch to: a trained version (`sqa encoders list`), minilm, or a folder"
    ),
) -> None:
    """Re-encode every shard with another encoder and switch the index to it in one snapshot; run the
    same command again to resume an interrupted run."""
    reencode_index(encoder)


def reencode_index(spec: str) -> None:
    """Switch the index to the encoder `spec` names (a trained version, minilm or a folder)."""
    from app.bootstrap.builders import resolve_device  # noqa: PLC0415 (lazy: faiss)
    from models.encoders import load_encoder  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: numpy)
    from workers.reencode import reencode  # noqa: PLC0415 (lazy: faiss)

    s = settings()
    try:
        enc = load_encoder(spec, device=resolve_device(s), encoders_dir=s.encoders_dir, backend=s.encoder_backend)
    except (ValueError, RuntimeError) as exc:
        fail(str(exc))
    with context() as ctx:
        job = reencode(ctx.sessions, enc, ctx.ingest, runner=ctx.runner)
    c, t = job.counts or {}, job.timings or {}
    if not c.get("snapshot"):
        typer.echo(job.message)
        return
    typer.echo(
        f"re-encoded {c['passages']} passages in {c['shards']} shards with {c['encoder']} "
        f"({t.get('passages_per_s')} passages/s); snapshot {c['snapshot']} serves"
    )
    if s.encoder != "auto":
        typer.echo(
            f"SQA_ENCODER is pinned to {s.encoder}: set it to auto (or {c['encoder']}) so that the "
            "server and the ingests use the new encoder"
        )


@index_cli.command("status", epilog="Example: sqa index status")
@guard
def index_status() -> None:
    """Show the newest snapshot and check its files against the database."""
    from serving.index_state import IndexState  # noqa: PLC0415 (lazy: faiss)

    s = settings()
    db = open_database(s)
    try:
        state = IndexState(db.sessions, s.index_dir, **_encoder_identity(s))
        if not state.refresh():
            fail("no index snapshot yet: run `sqa ingest --through YYYY-MM`", code=1)
        snap = state.current()
        typer.echo(
            f"snapshot {snap.snapshot_id}: {snap.index.ntotal} vectors, encoder {snap.manifest.encoder}, "
            f"newest day {snap.newest_day}"
        )
        for e in snap.manifest.shards:
            typer.echo(
                f"  {e.key:16s} {e.count:8d} vectors  {e.min_day}..{e.max_day}  {e.file}  {e.index.kind}  "
                f"{e.encoder or snap.manifest.encoder}{'' if e.bm25 else '  (no BM25: sqa index bm25)'}"
            )
        typer.echo("files and database agree")
    finally:
        db.close()


@index_cli.command("bm25", epilog="Example: sqa index bm25")
@guard
def index_bm25() -> None:
    """Build the BM25 files of shards ingested before BM25 existed (SQA_RETRIEVER=bm25|hybrid needs them)."""
    from workers.bm25_backfill import build_missing_lexical  # noqa: PLC0415 (lazy: faiss)

    s = settings()
    db = open_database(s)
    try:
        out = build_missing_lexical(db.sessions, s.index_dir)
    finally:
        db.close()
    if not out["built"]:
        typer.echo(f"every shard of snapshot {out['snapshot']} already has its BM25 index")
    else:
        typer.echo(f"BM25 for {', '.join(out['built'])} ({out['passages']} passages); snapshot {out['snapshot']}")


def _encoder_identity(s) -> dict:
    from app.bootstrap.builders import encoder_identity  # noqa: PLC0415 (lazy: faiss)

    name, dim = encoder_identity(s)
    return {"encoder": name, "dim": dim}
