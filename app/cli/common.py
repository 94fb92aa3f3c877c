"""What every `sqa` command shares: the root Typer app, settings, errors, dates, jobs, number formats.

Commands import the heavy modules (app.bootstrap, models, workers) inside their functions, so
`sqa --help` and the table commands start without loading torch.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from indexer.dates import InvalidDateError, parse_day, parse_month
from indexer.index_errors import IndexIntegrityError
from serving.errors import ServiceError
from settings import Settings, get_settings

if TYPE_CHECKING:
    from workers.job_context import JobContext
    from workers.runner import JobHandle

cli = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Streaming QA over time-stamped news. All state lives under SQA_HOME (default ./.sqa).",
)


def fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def settings() -> Settings:
    try:
        return get_settings()
    except Exception as exc:  # pydantic's ValidationError: say which setting is wrong
        fail(f"bad settings: {exc}")
        raise


def open_database(s: Settings, *, migrate: bool = True):
    """The settings' database, migrated: app.bootstrap.builders' `open_database` without importing the
    services and workers that the table commands (jobs, models, index status) never use."""
    from store.engine import open_database as open_url  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: store.engine pulls sqlalchemy)

    s.ensure_dirs()
    return open_url(s.db_url, migrate=migrate)


def day_option(value: str | None, what: str) -> dt.date | None:
    if value is None:
        return None
    try:
        return parse_day(value, what=what)
    except InvalidDateError as exc:
        fail(str(exc))
        raise


def month_option(value: str | None, what: str) -> dt.date | None:
    """A YYYY-MM option as the month's first day (None when not given); a bad one exits 2."""
    if value is None:
        return None
    try:
        return parse_month(value)
    except InvalidDateError as exc:
        fail(f"{what}: {exc}")
        raise


def guard(fn):
    """Turn domain errors into a one-line CLI error with a non-zero exit."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ServiceError, InvalidDateError, IndexIntegrityError, FileNotFoundError, ValueError) as exc:
            fail(str(exc))

    return wrapper


def context(*, migrate: bool = True):
    """The job context of this command (`with context() as ctx:`): database, runner, configs."""
    from app.bootstrap import open_context, show_bars  # noqa: PLC0415 (lazy: keeps `sqa --help` fast: app.bootstrap pulls the services and faiss)

    return open_context(settings(), migrate=migrate, bar=show_bars())


def run_job(
    kind: str,
    params: dict,
    work: Callable[[JobContext, JobHandle], Any],
    *,
    result_key: str | None = None,
    lock: str | None = None,
) -> Any:
    """Record a job of `kind` around `work(ctx, job)` and run it here and now (through the job
    runner: progress bar, state, failure recorded); returns what `work` returns, also kept in the
    job's counts under `result_key`. `lock` names a lock the job holds while it runs."""
    with context() as ctx:
        runner = ctx.runner
        return runner.run_new(
            kind, params, lambda job: work(ctx, job), result_key=result_key, lock=runner.lock(lock) if lock else None
        )


def num(value, digits: int = 2, sign: bool = False) -> str:
    """A figure for a table: '-' for None or NaN."""
    if value is None or value != value:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"
