"""`sqa ask`, `serve`, `worker`, `schedule` and `jobs`: running the service."""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict

import typer

from app.api.request_ids import configure_logging
from app.cli.common import cli, context, day_option, fail, guard, open_database, settings

jobs_cli = typer.Typer(no_args_is_help=True, help="Jobs.")
cli.add_typer(jobs_cli, name="jobs")


@cli.command("worker", epilog="Example: sqa worker")
@guard
def worker() -> None:
    """Run the scheduler process: monthly ingest and quarterly evaluation (never inside the web server)."""
    from app.bootstrap import run_worker  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)

    s = settings()
    configure_logging("INFO", s.log_format)
    run_worker(s)


@cli.command("schedule", epilog="Example: sqa schedule --run monthly-ingest --period 2024-02")
@guard
def schedule(
    run: str | None = typer.Option(
        None, help="run this scheduled job now (monthly-ingest, quarterly-evaluation, weekly-adaptation)"
    ),
    period: str | None = typer.Option(
        None, help="with --run: the month (YYYY-MM), the quarter (YYYYQn) or the adaptation's cut (YYYY-MM-DD)"
    ),
) -> None:
    """List the scheduled jobs and their next runs, or run one now."""
    from app.bootstrap.job_configs import scheduler_config  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)
    from workers.scheduler import scheduled_jobs, trigger_now  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: workers.scheduler pulls faiss)

    if run:
        with context() as ctx:
            typer.echo(json.dumps(trigger_now(ctx, run, period), default=str, indent=2))
        return
    jobs = scheduled_jobs(scheduler_config(settings()))
    if not jobs:
        typer.echo("no jobs scheduled yet: `sqa worker` registers them when it first starts")
    for j in jobs:
        typer.echo(f"{j['id']:22s} next {j.get('next_run_time')}  ({j.get('trigger')})")


# ---- ask, serve, jobs ------------------------------------------------------------------------------


@cli.command("ask", epilog="Example: sqa ask 'Who won the Super Bowl?' --as-of 2023-02-14 --top-k 5")
@guard
def ask(
    question: str,
    as_of: str | None = typer.Option(None, help="YYYY-MM-DD (default: today)"),
    top_k: int | None = typer.Option(None),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Answer one question as of a date and print the cited passages."""
    from app.bootstrap.builders import build_answer_service, build_encoder, build_reader, open_database  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls faiss)

    s = settings()
    asked = day_option(as_of, "--as-of")
    quiet_model_loading()  # the answer, not the weights' loading bars
    db = open_database(s)
    try:
        service = build_answer_service(s, db, build_encoder(s), build_reader(s))
        service.index_state.refresh()
        result = service.answer(question, asked, top_k)
    finally:
        db.close()
    if as_json:
        typer.echo(json.dumps({**asdict(result), "grounded": result.grounded}, default=str, indent=2))
        return
    typer.echo(f"Q ({result.as_of}): {question}")
    typer.echo(
        f"A: {result.answer or '(no answer)'}"
        + (f"    (reader's confidence {result.confidence:.2f})" if result.confidence is not None else "")
    )
    if result.answer:
        ranks = [i for i, p in enumerate(result.passages, 1) if p.passage_id in result.evidence]
        typer.echo(
            "   stated in passage " + ", ".join(f"[{i}]" for i in ranks)
            if ranks
            else "   not stated in any passage read: an inference or a guess"
        )
    for note in result.notes:
        typer.echo(f"note: {note}")
    for i, p in enumerate(result.passages, 1):
        typer.echo(f"  [{i}] {p.published}  {p.score:.3f}  {p.title[:80]}\n      {p.url}\n      {p.text[:200]}…")


def quiet_model_loading() -> None:
    """No progress bars or loading chatter from transformers and the hub on the terminal."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from transformers.utils import logging as hf_logging  # noqa: PLC0415 (lazy: transformers)

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


@cli.command("serve", epilog="Example: sqa serve --host 0.0.0.0 --port 8000 --log-format json")
def serve(
    host: str = typer.Option("127.0.0.1"),
    port: int = typer.Option(8000),
    log_level: str = typer.Option("info"),
    log_format: str | None = typer.Option(
        None, help="text or json (default SQA_LOG_FORMAT): one JSON object a line with the request id"
    ),
    forwarded_allow_ips: str | None = typer.Option(
        None,
        help="behind a reverse proxy: the proxy addresses whose X-Forwarded-For is trusted (comma-"
        "separated, or *), so that rate limits count each real client (default 127.0.0.1)",
    ),
) -> None:
    """Run the HTTP API under uvicorn (one process: the models load once)."""
    import uvicorn  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: uvicorn, only `sqa serve`)

    from app.main import create_app  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.main pulls the services and faiss)

    s = settings()

    try:
        configure_logging(log_level, log_format or s.log_format)
    except ValueError as exc:
        fail(str(exc))
    # the access lines come from app.access (with the request id and the duration), not uvicorn's
    uvicorn.run(
        create_app(s),
        host=host,
        port=port,
        log_level=log_level,
        log_config=None,
        access_log=False,
        proxy_headers=True,
        forwarded_allow_ips=forwarded_allow_ips,
    )


@jobs_cli.command("list", epilog="Example: sqa jobs list --kind ingest --state failed --limit 5")
@guard
def jobs_list(
    limit: int = typer.Option(20, min=1, max=1000, help="the newest this many"),
    kind: str | None = typer.Option(None, help="only this kind (ingest, auto-train, finetune, ...)"),
    state: str | None = typer.Option(
        None, help="only this state (queued, running, succeeded, failed, interrupted, skipped)"
    ),
) -> None:
    """The newest jobs, one line each: id, kind, state, progress, started, duration, message."""
    from sqlalchemy import select  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: sqlalchemy)

    from store.tables import Job  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.tables pulls sqlalchemy)

    db = open_database(settings())
    try:
        with db.sessions() as session:
            q = select(Job).order_by(Job.id.desc()).limit(limit)
            if kind:
                q = q.where(Job.kind == kind)
            if state:
                q = q.where(Job.state == state)
            jobs = session.scalars(q).all()
            for j in jobs:
                end = j.finished_at or j.heartbeat_at
                took = f"{(end - j.started_at).total_seconds():.0f} s" if end and j.started_at else "-"
                started = j.started_at.strftime("%Y-%m-%d %H:%M") if j.started_at else "-"
                typer.echo(
                    f"{j.id:>5}  {j.kind:<20} {j.state:<11} {100 * (j.progress or 0):5.1f}%  {started}  "
                    f"{took:>8}  {(j.error or j.message or '')[:90]}"
                )
            if not jobs:
                typer.echo("no jobs" + (" of that kind/state" if kind or state else " yet"))
    finally:
        db.close()


ENDED_STATES = ("succeeded", "failed", "interrupted", "skipped")


@jobs_cli.command("show", epilog="Example: sqa jobs show 7 --follow")
@guard
def jobs_show(
    job_id: int = typer.Argument(..., min=1, help="the job's id (`sqa jobs list`)"),
    follow: bool = typer.Option(
        False,
        "--follow",
        "-f",
        help="print its progress as it changes until it ends; the exit code "
        "is 0 if it succeeded (or was skipped), 1 otherwise",
    ),
    every: float = typer.Option(1.0, min=0.05, max=60, help="--follow: seconds between looks"),
) -> None:
    """Show one job as JSON, or follow a running one.

    `sqa jobs show 7` prints the row; with --follow it prints a line each time its progress or message
    changes (a job run by the server, the worker or another shell), then the row.
    """
    from store.tables import Job  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.tables pulls sqlalchemy)

    db = open_database(settings())
    try:
        last = None
        while True:
            with db.sessions() as session:
                job = session.get(Job, job_id)
                if job is None:
                    fail(f"no job with id {job_id} (`sqa jobs list` shows the newest)")
                row = {c.name: getattr(job, c.name) for c in Job.__table__.columns}
            if not follow:
                break
            now = (row["state"], round(100 * (row["progress"] or 0), 1), row["message"])
            if now != last:
                typer.echo(
                    f"{time.strftime('%H:%M:%S')}  job {job_id} {row['kind']}: {now[0]:<11} {now[1]:5.1f}%  "
                    f"{row['error'] or row['message'] or ''}"
                )
                last = now
            if row["state"] in ENDED_STATES:
                break
            time.sleep(every)
        typer.echo(json.dumps(row, default=str, indent=2))
    finally:
        db.close()
    if follow and row["state"] not in ("succeeded", "skipped"):
        raise typer.Exit(1)
