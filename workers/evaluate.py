"""Evaluation jobs: answer a quarter's questions as of their own dates under one or more index
states, store every per-question result, summarise and render a report.

Per-question rows (EvalResult) hold the answer, EM/F1, retrieval recall, the cited passages and
their dates, so any later analysis (the temporal grid, drift regressions) is recomputed from the
database without answering again.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from evaluation.metrics import answer_in_text, days_between, exact_match, token_f1
from evaluation.subsets import needs_choices
from evaluation.temporal import TemporalGrid, jsonable, quarter_bounds, quarter_index, quarter_of
from evaluation.trust import trust_by_quarter
from serving.answering import AnswerService
from serving.errors import IndexNotReadyError
from serving.index_state import LoadedSnapshot
from store.base import utcnow
from store.tables import Article, EvalResult, EvalRun, Question
from workers.config import EvalConfig, TransportConfig
from workers.version_transport import version_transport

if TYPE_CHECKING:
    from workers.job_context import JobContext

log = logging.getLogger(__name__)

RECENT_DAYS = 31  # evidence published within the month before the question: "recent"


def classify_subset(question: Question, published: dict[str, tuple[dt.date, str]]) -> str:
    """recent | past | unknown. StreamingQA says it; for RealTimeQA the evidence is the quiz's gold
    article, else the search results that contain the answer, published on or before the question."""
    label = (question.meta or {}).get("recent_or_past")
    if label in ("recent", "past"):
        return label
    meta = question.meta or {}
    evidence = [
        published[u][0] for u in meta.get("gold_urls", []) if u in published and published[u][0] <= question.asked
    ]
    if not evidence:
        evidence = [
            published[u][0]
            for u in meta.get("search_result_urls", [])
            if u in published
            and published[u][0] <= question.asked
            and answer_in_text(question.answers, published[u][1])
        ]
    if not evidence:
        return "unknown"
    return "recent" if (question.asked - max(evidence)).days <= RECENT_DAYS else "past"


def quarter_questions(session: Session, quarter: str) -> list[Question]:
    first, last = quarter_bounds(quarter)
    rows = session.scalars(
        select(Question).where(Question.asked.between(first, last)).order_by(Question.asked, Question.qid)
    ).all()
    return [q for q in rows if not needs_choices(q.text)]


def subsets_for(session: Session, questions: Sequence[Question]) -> dict[int, str]:
    urls = {u for q in questions for key in ("gold_urls", "search_result_urls") for u in (q.meta or {}).get(key, [])}
    published: dict[str, tuple[dt.date, str]] = {}
    url_list = sorted(urls)
    for i in range(0, len(url_list), 500):
        for url, day, text in session.execute(
            select(Article.url, Article.published, Article.text).where(Article.url.in_(url_list[i : i + 500]))
        ):
            published[url] = (day, text)
    return {q.id: classify_subset(q, published) for q in questions}


def reader_sample(questions: Sequence[Question], cfg: EvalConfig) -> set[int]:
    """Ids of the questions the reader answers: all, or a seeded sample of max_questions."""
    if not cfg.max_questions or cfg.max_questions >= len(questions):
        return {q.id for q in questions}
    return {q.id for q in random.Random(cfg.seed).sample(list(questions), cfg.max_questions)}


def answer_question(service: AnswerService, snapshot: LoadedSnapshot, q: Question, cfg: EvalConfig, read: bool) -> dict:
    """One question under one state: the EvalResult columns (without run and state)."""
    t0 = time.perf_counter()
    result = service.answer(q.text, q.asked, cfg.top_k, snapshot=snapshot, read=read)
    cited = result.passages[: cfg.reader_passages or service.passages_for(service.reader)]
    days = days_between(q.asked, [p.published for p in cited])
    return dict(
        answer=result.answer if read else None,
        em=exact_match(result.answer, q.answers) if read else None,
        f1=token_f1(result.answer, q.answers) if read else None,
        recall=float(any(answer_in_text(q.answers, p.dated_text) for p in result.passages)),
        days=float(statistics.median(days)) if days else None,
        passages=[[p.passage_id, p.published.isoformat(), round(p.score, 4)] for p in result.passages],
        grounded=result.grounded if read else None,
        confidence=result.confidence if read else None,
        latency_ms=round((time.perf_counter() - t0) * 1000, 1),
        snapshot_id=snapshot.snapshot_id,
    )


def visible_files(snapshot: LoadedSnapshot, as_of: dt.date) -> tuple[str, ...]:
    """The shard files a question as of `as_of` can see: two states with the same files (and the
    same reader) give the same answer, so it is computed once and copied."""
    return tuple(e.file for e in snapshot.manifest.shards if e.span[0] <= as_of)


def evaluate_states(
    sf: sessionmaker[Session],
    service: AnswerService,
    run_id: int,
    test_quarter: str,
    states: dict[str, LoadedSnapshot],
    cfg: EvalConfig,
    *,
    progress=None,
) -> int:
    """Answer the test quarter's questions under each state; skips rows already stored (resume).

    Returns how many rows were written.
    """
    with sf() as session:
        questions = quarter_questions(session, test_quarter)
        subsets = subsets_for(session, questions)
        done = set(
            session.execute(
                select(EvalResult.question_id, EvalResult.state_quarter).where(
                    EvalResult.run_id == run_id, EvalResult.test_quarter == test_quarter
                )
            ).all()
        )
    readable = reader_sample(questions, cfg)
    written = 0
    memo: dict[tuple[int, tuple[str, ...]], dict] = {}
    for state_q, snap in sorted(states.items(), key=lambda kv: quarter_index(kv[0])):
        if progress is not None:
            progress.stage(f"{test_quarter} with the {state_q} index", len(questions))
        batch = []
        for q in questions:
            if progress is not None:
                progress.advance(1)
            if (q.id, state_q) in done:
                continue
            key = (q.id, visible_files(snap, q.asked))
            row = memo.get(key)
            if row is None:
                row = answer_question(service, snap, q, cfg, q.id in readable)
                memo[key] = row
            batch.append(
                EvalResult(
                    run_id=run_id,
                    question_id=q.id,
                    test_quarter=test_quarter,
                    state_quarter=state_q,
                    subset=subsets[q.id],
                    **row,
                )
            )
            if len(batch) >= 25:  # commit as we go: an interrupted run resumes from here
                written += _commit(sf, batch)
                batch = []
        written += _commit(sf, batch)
    return written


def _commit(sf: sessionmaker[Session], rows: list[EvalResult]) -> int:
    if rows:
        with sf() as session, session.begin():
            session.add_all(rows)
    return len(rows)


def run_rows(session: Session, run_id: int) -> list[dict]:
    """Per-question results in the shape evaluation.temporal.TemporalGrid takes."""
    rows = session.execute(
        select(EvalResult, Question.qid)
        .join(Question, Question.id == EvalResult.question_id)
        .where(EvalResult.run_id == run_id)
    ).all()
    out = []
    for r, qid in rows:
        metrics = {"recall": r.recall}
        if r.f1 is not None:
            metrics.update(f1=r.f1, em=r.em)
        if r.days is not None:
            metrics["days"] = r.days
        out.append(
            {
                "question_id": qid,
                "test_quarter": r.test_quarter,
                "state_quarter": r.state_quarter,
                "subset": r.subset,
                "metrics": metrics,
                "grounded": r.grounded,
                "confidence": r.confidence,
            }
        )
    return out


def render_report(
    sf: sessionmaker[Session], run_id: int, out: Path, title: str, cfg: EvalConfig | None = None
) -> tuple[dict, dict[str, Path]]:
    """Grid scores, lag tables, DS/AS from the stored results, and the report files in `out`."""
    with sf() as session:
        rows = run_rows(session, run_id)
    grid = TemporalGrid.from_results(rows)
    summary = jsonable(grid.summary())
    summary["counts"] = {"results": len(rows), "answered_by_reader": sum("f1" in r["metrics"] for r in rows)}
    trust = trust_by_quarter(rows)
    if trust:
        summary["trust"] = trust
    transport = run_transport(sf, run_id, cfg.transport) if cfg is not None and cfg.transport else None
    from evaluation.report import write_report  # noqa: PLC0415 (lazy: evaluation.report imports matplotlib; only the jobs that draw load it)

    return summary, write_report(out, title=title, summary=summary, grid=grid, by_quarter=None, transport=transport)


def run_transport(sf: sessionmaker[Session], run_id: int, cfg: TransportConfig) -> dict | None:
    """Drift, transportability and predicted F1 of the run's version over every quarter evaluated
    with it; None (logged) when there is too little to say, which never fails a report."""
    try:
        with sf() as session:
            return version_transport(session, session.get(EvalRun, run_id).params or {}, cfg)
    except Exception as exc:  # drift profiles missing, an unreadable shard...: the report goes on without it
        log.warning("no drift/transportability section in the report of run %d: %s", run_id, exc)
        return None


def summarise_run(
    sf: sessionmaker[Session], run_id: int, reports_dir: Path, title: str, cfg: EvalConfig | None = None
) -> dict:
    """Render the run's report under reports_dir and store its summary on the run."""
    out = reports_dir / f"run-{run_id}"
    summary, files = render_report(sf, run_id, out, title, cfg)
    with sf() as session, session.begin():
        run = session.get(EvalRun, run_id)
        run.summary, run.report_dir = summary, str(out)
    return {"summary": summary, "files": {k: str(v) for k, v in files.items()}}


def find_or_create_run(sf: sessionmaker[Session], kind: str, params: dict, job_id: int | None) -> int:
    """Reopen the run with the same params (an interrupted one resumes; a finished one has nothing
    left to answer), or start a new one."""
    with sf() as session, session.begin():
        for run in session.scalars(select(EvalRun).where(EvalRun.kind == kind).order_by(EvalRun.id.desc())):
            if run.params == params:
                run.state, run.error = "running", None
                return run.id
        run = EvalRun(kind=kind, params=params, state="running", summary={}, job_id=job_id)
        session.add(run)
        session.flush()
        return run.id


def finish_run(sf: sessionmaker[Session], run_id: int, error: str | None = None) -> None:
    with sf() as session, session.begin():
        run = session.get(EvalRun, run_id)
        run.state = "failed" if error else "succeeded"
        run.error, run.finished_at = error, utcnow()


def evaluate_current(
    sf: sessionmaker[Session],
    service: AnswerService,
    quarter: str,
    cfg: EvalConfig,
    reports_dir: Path,
    *,
    job_id: int | None = None,
    progress=None,
) -> int:
    """The quarterly evaluation: the quarter's questions against the serving snapshot."""
    quarter_bounds(quarter)  # a bad quarter fails here, before any run row exists
    service.index_state.refresh()
    snap = service.index_state.current()
    if snap is None:
        raise IndexNotReadyError("no index to evaluate: run `sqa ingest` first")
    state_q = quarter_of(snap.newest_day) if snap.newest_day else quarter
    params = {
        "quarter": quarter,
        "snapshot": snap.snapshot_id,
        "reader": service.reader.name,
        "encoder": snap.manifest.encoder,
        "top_k": cfg.top_k,
        "reader_passages": cfg.reader_passages,
        "max_questions": cfg.max_questions,
    }
    run_id = find_or_create_run(sf, "quarterly", params, job_id)
    return complete_run(
        sf,
        service,
        run_id,
        {quarter: {state_q: snap}},
        cfg,
        reports_dir,
        f"Quarterly evaluation {quarter}",
        progress=progress,
    )


def complete_run(
    sf: sessionmaker[Session],
    service: AnswerService,
    run_id: int,
    work: dict[str, dict[str, LoadedSnapshot]],
    cfg: EvalConfig,
    reports_dir: Path,
    title: str,
    *,
    progress=None,
) -> int:
    """Answer every test quarter under its states ({test quarter: {state quarter: snapshot}}),
    summarise, render the report and close the run (failed, with the error, if anything raises)."""
    try:
        for test_quarter, states in work.items():
            evaluate_states(sf, service, run_id, test_quarter, states, cfg, progress=progress)
        summarise_run(sf, run_id, reports_dir, title, cfg)
    except BaseException as exc:
        finish_run(sf, run_id, str(exc) or type(exc).__name__)
        raise
    finish_run(sf, run_id)
    return run_id


def run_quarterly_evaluation(ctx: JobContext, quarter: str, *, job_id: int | None = None) -> int:
    """The quarterly evaluation of the scheduler: the served pipeline on the quarter's questions."""
    return evaluate_current(
        ctx.sessions, ctx.load_answer_service(), quarter, ctx.evaluation, ctx.reports_dir, job_id=job_id
    )
