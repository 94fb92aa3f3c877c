"""What the benchmarks over a home's questions share (bench_quality, bench_ceiling, bench_reconcile,
bench_live): the served pipeline opened as `sqa serve` builds it over a home (`open_served`), or a
recorded index state instead of the serving one; the windows of RealTimeQA's generation questions
and the options that choose them (--home, --windows, --max-questions, --seed); and whether a
question's own articles hold its answer.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
from pathlib import Path

from sqlalchemy import select

from bench.rolling import CachedReadings
from evaluation.bakeoff import generation_subset
from evaluation.metrics import answer_in_text
from serving.reader_state import ReaderState
from serving.reranking import FOLLOW_ACTIVE
from settings import Settings
from store.tables import Article, IndexSnapshot
from workers.bakeoff_gold import load_questions

KS = (1, 5, 10, 20, 50)  # the retrieval depths recall is reported at


def parse_windows(text: str) -> list[tuple[dt.date, dt.date]]:
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        first, _, last = part.partition(":")
        a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
        if a > b:
            raise ValueError(f"window {part}: {a} is after {b}")
        out.append((a, b))
    if not out:
        raise ValueError("no window given (use FIRST:LAST,...)")
    return out


def each_window(db, args):
    """(label, last day, questions, left out by reason) for each of `args.windows` (window_questions
    with --max-questions and --seed); a window without questions is said and skipped."""
    for first, last in args.windows:
        questions, left_out = window_questions(db, first, last, args.max_questions, args.seed)
        label = f"{first}..{last}"
        if not questions:
            print(f"\n{label}: no questions in this window (imported?)")
            continue
        yield label, last, questions, left_out


class NotReady(Exception):
    """A home that cannot serve yet: no database, or no index snapshot (the message says what to run)."""


def open_served(
    home: Path,
    *,
    reader: str | None = None,
    reranker: str | None | object = FOLLOW_ACTIVE,
    readings: Path | None = None,
):
    """(db, service, serving snapshot) as `sqa serve` builds them over `home`, from the environment's
    SQA_* settings with their defaults; NotReady without a database or an index snapshot. The caller
    closes db.

    `reader`: an SQA_READER spec instead of the environment's ("version:NAME", "gemma");
    `reranker`: a re-ranker version pinned instead of the active one (None: none re-ranks);
    `readings`: a JSONL file that keeps every reading (bench.rolling.CachedReadings), so that the
    same passages are read once across runs.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if not (home / "sqa.db").exists() and "SQA_DATABASE_URL" not in os.environ:
        raise NotReady(
            f"{home} holds no database: import and ingest the RealTimeQA slice first "
            "(../shared/data/realtimeqa; see README)"
        )
    from app.bootstrap.builders import (  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
        build_answer_service,
        build_encoder,
        build_reader_state,
        open_database,
    )

    settings = Settings(home=home, **({"reader": reader} if reader else {}))
    db = open_database(settings, migrate=False)
    try:
        state = build_reader_state(settings, db)
        if readings is not None:
            state = ReaderState(CachedReadings(state.reader(), readings), version=state.current().version)
        service = build_answer_service(settings, db, build_encoder(settings), state, reranker=reranker)
        if not service.index_state.refresh() and service.index_state.current() is None:
            raise NotReady(f"no index snapshot in {home}: run `sqa ingest` first")
    except BaseException:
        db.close()
        raise
    return db, service, service.index_state.current()


def window_questions(db, first: dt.date, last: dt.date, max_questions: int, seed: int):
    """(questions, left out by reason): RealTimeQA's generation subset of the questions asked in
    [first, last], a `seed` sample of `max_questions` of them (0: all), by date."""
    kept, left_out = generation_subset(load_questions(db.sessions, first, last))
    questions = sorted(kept, key=lambda q: (q.asked, q.qid))
    if max_questions and len(questions) > max_questions:
        questions = sorted(random.Random(seed).sample(questions, max_questions), key=lambda q: (q.asked, q.qid))
    return questions, left_out


def own_article_hit(session, question) -> bool:
    """Does any stored article of the question's own (its gold and search-result articles, published
    by its date) hold a gold answer?"""
    meta = question.meta or {}
    urls = list(dict.fromkeys([*meta.get("gold_urls", []), *meta.get("search_result_urls", [])]))
    if not urls:
        return False
    texts = session.scalars(
        select(Article.text).where(Article.url.in_(urls), Article.published <= question.asked)
    ).all()
    return any(answer_in_text(list(question.answers), t) for t in texts)


def open_recorded_snapshot(service, db, snapshot_id: str):
    """A recorded index state (an older serving snapshot, or a replay's quarter-end one), or None."""
    with db.sessions() as session:
        row = session.scalars(select(IndexSnapshot).where(IndexSnapshot.snapshot_id == snapshot_id)).first()
        if row is None:
            return None
        session.expunge(row)
    return service.index_state.open(row)


def question_arguments(description: str, windows: str, max_questions: int) -> argparse.ArgumentParser:
    """A parser with the options every benchmark over a home's questions takes: --home, --windows,
    --max-questions and --seed (`parsed_windows` checks them)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--home",
        default=os.environ.get("SQA_HOME", ".sqa"),
        help="SQA_HOME with the questions imported and the windows' months ingested",
    )
    ap.add_argument("--windows", default=windows, help="FIRST:LAST question days, comma-separated")
    ap.add_argument("--max-questions", type=int, default=max_questions, help="a --seed sample per window (0: all)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def parsed_windows(ap: argparse.ArgumentParser, argv):
    """`ap`'s arguments with --windows parsed; a bad window or a negative --max-questions exits 2."""
    args = ap.parse_args(argv)
    try:
        args.windows = parse_windows(args.windows)
    except ValueError as exc:
        ap.error(str(exc))
    if args.max_questions < 0:
        ap.error("--max-questions must be >= 0")
    return args
