"""The scheduled jobs: the monthly ingest, the quarterly evaluation and the weekly adaptation.

Each is a plain function of a `JobContext` and its period, run by the scheduler process (through
app.bootstrap's `scheduled_*` functions) and by the admin API alike. Each records one `Job` row
(kind, params {"period": ...}) through the job runner and is idempotent per period: a period whose
job already succeeded is skipped, and the skip is recorded as a job row in state "skipped"; a failed
or interrupted period runs again. One job of a kind runs at a time per SQA_HOME (the runner's
named lock, released if the process dies).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from evaluation.temporal import quarter_index
from indexer.dates import month_end, month_key, month_start, parse_month
from indexer.importers import read_articles_jsonl, read_realtimeqa
from indexer.jsonl import keep_longest
from indexer.records import ArticleRecord, ImportReport, QuestionRecord
from serving.errors import InvalidInputError, NoArticlesError
from store.tables import Article, EvalRun
from workers import evaluate
from workers.after_ingest import train_after_ingest
from workers.auto_train import describe, run_after_ingest
from workers.imports import store_records
from workers.ingest import ingest
from workers.ingest_plans import IngestParams
from workers.runner import JobHandle

if TYPE_CHECKING:
    from workers.job_context import JobContext


MONTHLY_INGEST = "monthly-ingest"
QUARTERLY_EVALUATION = "quarterly-evaluation"
WEEKLY_ADAPTATION = "weekly-adaptation"


# ---- periods ---------------------------------------------------------------------------------------


def today_utc() -> dt.date:
    return dt.datetime.now(dt.UTC).date()


def previous_month(today: dt.date) -> str:
    """The month just ended: '2024-02' for any day of March 2024."""
    return month_key(month_start(today) - dt.timedelta(days=1))


def previous_quarter(today: dt.date) -> str:
    """The quarter just ended: '2023Q4' for any day of January to March 2024."""
    current = (today.month - 1) // 3 + 1
    return f"{today.year - 1}Q4" if current == 1 else f"{today.year}Q{current - 1}"


def parse_quarter(value: str) -> str:
    """'2023q2 ' -> '2023Q2'; anything else is an InvalidInputError."""
    q = value.strip().upper() if isinstance(value, str) else value
    try:
        quarter_index(q)
    except ValueError:
        raise InvalidInputError(f"quarter {value!r} is not a quarter (use YYYYQN, for example 2023Q2)") from None
    return q


def normalize_period(kind: str, period: str) -> str:
    """Validate a period for a job kind: a month 'YYYY-MM', a quarter 'YYYYQN' or, for the weekly
    adaptation, its cut 'YYYY-MM-DD' (it learns what is dated before that day)."""
    if kind == MONTHLY_INGEST:
        return month_key(parse_month(period))  # InvalidDateError names the bad value
    if kind == QUARTERLY_EVALUATION:
        return parse_quarter(period)
    if kind == WEEKLY_ADAPTATION:
        try:
            return dt.date.fromisoformat(period.strip()).isoformat()
        except (ValueError, AttributeError):
            raise InvalidInputError(
                f"cut {period!r} is not a day (use YYYY-MM-DD: the adaptation learns what is dated before it)"
            ) from None
    raise InvalidInputError(f"unknown job kind {kind!r} (use {', '.join(JOBS)})")


# ---- the monthly ingest ----------------------------------------------------------------------------


def read_news_source(
    source: str, first: dt.date, last: dt.date
) -> tuple[list[ArticleRecord], list[QuestionRecord], ImportReport]:
    """Articles (and questions) published in [first, last] from SQA_NEWS_SOURCE; '' reads nothing."""
    if not source.strip():
        return [], [], ImportReport()
    kind, _, where = source.partition(":")
    path = Path(where).expanduser()
    if kind == "realtimeqa" and where:
        return read_realtimeqa(path, since=first, until=last)
    if kind == "inbox" and where:
        if not path.is_dir():
            raise FileNotFoundError(f"the news inbox {path} is not a directory (SQA_NEWS_SOURCE={source})")
        report = ImportReport()
        merged: dict[str, ArticleRecord] = {}
        files = sorted(
            p for p in path.iterdir() if p.is_file() and (p.name.endswith(".jsonl") or p.name.endswith(".jsonl.gz"))
        )
        for file in files:
            records, _ = read_articles_jsonl(file, since=first, until=last, report=report, source="inbox")
            for record in records:  # the same url in two files: the longest text wins
                keep_longest(merged, record, report)
        return sorted(merged.values(), key=lambda a: (a.published, a.url)), [], report
    raise InvalidInputError(
        f"SQA_NEWS_SOURCE={source!r} is not understood (use realtimeqa:PATH, inbox:PATH, "
        "or leave it empty to index what is already imported)"
    )


def _ingest_month(ctx: JobContext, run: JobHandle, month: str) -> str:
    first = parse_month(month)
    last = month_end(first)
    t0 = time.perf_counter()
    source = ctx.news_source or "nowhere (SQA_NEWS_SOURCE is empty)"
    run.update(progress=0.02, message=f"importing {month} from {source}")
    articles, questions, report = read_news_source(ctx.news_source, first, last)
    stored = store_records(ctx.sessions, articles, questions)
    imported = {
        "source": ctx.news_source,
        "articles": {
            "inserted": stored.articles.inserted,
            "updated": stored.articles.updated,
            "unchanged": stored.articles.unchanged,
        },
        "questions": {
            "inserted": stored.questions.inserted,
            "updated": stored.questions.updated,
            "unchanged": stored.questions.unchanged,
        },
        "skipped": report.skipped_total,
        "out_of_range": report.out_of_range,
    }
    t1 = time.perf_counter()
    run.update(
        progress=0.1, message=f"ingesting {month}", counts={"import": imported}, timings={"import_s": round(t1 - t0, 3)}
    )

    with ctx.sessions() as session:
        any_article = session.scalar(select(Article.id).where(Article.published.between(first, last)).limit(1))
    ingested: dict | None = None
    if any_article is not None:  # don't load the encoder for an empty month
        try:
            job = ingest(ctx.sessions, ctx.load_encoder(), ctx.ingest, IngestParams(month=first), runner=ctx.runner)
            ingested = {"job_id": job.id, **(job.counts or {}).get(month, {})}
        except NoArticlesError:
            ingested = None
    t2 = time.perf_counter()
    counts: dict = {"ingest": ingested, **train_after_ingest(ctx, first, indexed=ingested is not None)}
    if ingested is None:
        counts["note"] = "no articles"
        message = f"no articles published in {month}: nothing to index"
    else:
        message = (
            f"ingested {month}: {ingested.get('articles', 0)} articles, "
            f"{ingested.get('passages', 0)} passages (ingest job {ingested['job_id']})"
        )
    run.update(counts=counts, timings={"ingest_s": round(t2 - t1, 3)})
    return message


def monthly_ingest(ctx: JobContext, month: str | None = None, *, wait_s: float = 0.0) -> dict:
    """Import the news of a month from SQA_NEWS_SOURCE, index it, then train after it
    (`workers.after_ingest.train_after_ingest`: SQA_AUTO_TRAIN, then SQA_FINETUNE_POLICY).

    Args:
        month: 'YYYY-MM'; default the month just ended (UTC).
        wait_s: how long to wait for another worker running it (then: skipped as done, or run if
            that worker died); 0 refuses at once (409), as "run now" does.
    Returns:
        The job as a dict; `skipped` is true when the month had already succeeded.
    """
    period = normalize_period(MONTHLY_INGEST, month) if month else previous_month(today_utc())
    return ctx.runner.run_period(
        MONTHLY_INGEST,
        period,
        lambda run: _ingest_month(ctx, run, period),
        lock=ctx.runner.lock(MONTHLY_INGEST),
        wait_s=wait_s,
    )


# ---- the quarterly evaluation ----------------------------------------------------------------------


def _quarter_evaluated(session: Session, quarter: str) -> tuple[str, dict] | None:
    """A succeeded quarterly EvalRun of this quarter (from this job or from the CLI) counts as done."""
    rows = session.execute(
        select(EvalRun.id, EvalRun.params)
        .where(EvalRun.kind == "quarterly", EvalRun.state == "succeeded")
        .order_by(EvalRun.id.desc())
    )
    run_id = next((i for i, params in rows if (params or {}).get("quarter") == quarter), None)
    if run_id is None:
        return None
    return f"{quarter} already evaluated (eval run {run_id}); nothing to do", {"eval_run_id": run_id}


def _evaluate_quarter(ctx: JobContext, run: JobHandle, quarter: str) -> str:
    run.update(progress=0.02, message=f"evaluating {quarter}")
    eval_run_id = evaluate.run_quarterly_evaluation(ctx, quarter, job_id=run.job_id)
    with ctx.sessions() as session:
        row = session.get(EvalRun, eval_run_id)
        state, error = (row.state, row.error) if row is not None else (None, None)
    if row is None:
        raise RuntimeError(f"the evaluation of {quarter} returned eval run {eval_run_id}, which does not exist")
    if state == "failed":
        raise RuntimeError(f"eval run {eval_run_id} of {quarter} failed: {error}")
    run.update(counts={"eval_run_id": eval_run_id})
    return f"evaluated {quarter} (eval run {eval_run_id})"


def quarterly_evaluation(ctx: JobContext, quarter: str | None = None, *, wait_s: float = 0.0) -> dict:
    """Evaluate a quarter's questions (workers.evaluate.run_quarterly_evaluation).

    Args:
        quarter: 'YYYYQN'; default the quarter just ended (UTC).
        wait_s: as for `monthly_ingest`.
    Returns:
        The job as a dict; `skipped` is true when the quarter was already evaluated.
    """
    period = normalize_period(QUARTERLY_EVALUATION, quarter) if quarter else previous_quarter(today_utc())
    return ctx.runner.run_period(
        QUARTERLY_EVALUATION,
        period,
        lambda run: _evaluate_quarter(ctx, run, period),
        lock=ctx.runner.lock(QUARTERLY_EVALUATION),
        done=lambda session: _quarter_evaluated(session, period),
        wait_s=wait_s,
    )


# ---- the weekly adaptation ------------------------------------------------------------------------


def _adapt(ctx: JobContext, run: JobHandle, cut: dt.date) -> str:
    cfg = ctx.auto_train
    if not cfg.enabled:
        run.update(counts={"auto_train": {"action": "off"}})
        return "SQA_AUTO_TRAIN=false: nothing adapts"
    week = replace(cfg, held_back_days=cfg.adapt_days)
    run.update(progress=0.02, message=f"adapting to the {cfg.adapt_days} days before {cut}")
    done = run_after_ingest(ctx, cut, week, keep_going=True)
    run.update(counts={"auto_train": done})
    if "error" in done:
        raise RuntimeError(f"the adaptation's training (job {done.get('job_id')}) failed: {done['error']}")
    return describe(done) if done.get("action") != "skip" else f"nothing to adapt: {done['reason']}"


def weekly_adaptation(ctx: JobContext, cut: str | None = None, *, wait_s: float = 0.0) -> dict:
    """Adapt the re-ranker and the reader to the news of the last SQA_ADAPT_DAYS days (a week) as
    the monthly ingest's training does to a month (`workers.auto_train.after_ingest`): a re-ranker
    trained on what is dated before the cut, then the serving reader fine-tuned on the week's news
    with replay of older questions, each activated only if it beats what serves on that week.

    Args:
        cut: 'YYYY-MM-DD', the first day it does not learn; default today (UTC): everything that
            arrived up to yesterday, live pieces included.
        wait_s: as for `monthly_ingest`.
    Returns:
        The job as a dict; `skipped` when that cut already succeeded.
    """
    period = normalize_period(WEEKLY_ADAPTATION, cut) if cut else today_utc().isoformat()
    return ctx.runner.run_period(
        WEEKLY_ADAPTATION,
        period,
        lambda run: _adapt(ctx, run, dt.date.fromisoformat(period)),
        lock=ctx.runner.lock(WEEKLY_ADAPTATION),
        wait_s=wait_s,
    )


JOBS: dict[str, Callable[..., dict]] = {
    MONTHLY_INGEST: monthly_ingest,
    QUARTERLY_EVALUATION: quarterly_evaluation,
    WEEKLY_ADAPTATION: weekly_adaptation,
}
