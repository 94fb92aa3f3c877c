"""Live ingest replayed the way RealTimeQA is run: the window's news streamed in publication order
through POST /admin/articles to a real server and worker, each week's questions asked as of their
day right after that day's articles arrived, against the monthly schedule and the ceiling.

    .venv/bin/python -m bench.bench_live --home /tmp/live-home --out /tmp/live.json
    .venv/bin/python -m bench.bench_live --home /tmp/live-home --window 2023-04-01:2023-06-30 --max-questions 120

1. Setup (once per home; skipped when it already serves): import the RealTimeQA slice (questions,
   and the articles published since --since and before the window) and ingest them through the
   month before the window with the default encoder. A rerun on the same home first takes back what
   the last run streamed (`reset_stream`), so it starts from the setup again.
2. `sqa serve` and `sqa worker` start on 127.0.0.1 (the worker's live publisher, SQA_LIVE_MAX_WAIT_S=1),
   and --clients threads ask random window questions without pause (the load; its errors are
   counted). First the articles of the first --load-days days are POSTed at once (the ingest rate:
   passages until all are searchable); then day by day, the day's articles are POSTed; once the
   live queue is empty, up to --probes articles of the day are asked for at once (a thread each) by
   their title and first words until an answer as of the day cites them (arrival -> answerable
   latency, from the POST's answer to the first citing answer); then the day's questions are
   asked over HTTP (schedule b, live). The load runs through the burst's days and as many streamed
   days, then stops.
3. On the final index, in this process: (c) every question as of its day (everything indexed up
   front: the date filter keeps the rest out), and (a) the monthly schedule: as of its day, but
   retrieving only what was published before its month (`AnswerService.answer(index_as_of=)`: what
   a month shard index has on that day).
Printed: EM/F1 and evidence recall@5 (a gold answer string in the 5 passages retrieved) per schedule,
live paired with each of the others (evaluation.paired: McNemar p, bootstrap interval), latency
p50/p95, the ingest rate under load and the load's errors. The reader is the home's serving default.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

from sqlalchemy import delete, func, select

from bench.live_stream import ROOT, log, score_row, stream
from bench.served_questions import open_served, window_questions
from evaluation.paired import describe_paired, paired_em
from indexer.importers import read_realtimeqa
from settings import Settings
from store.tables import Article, IndexSnapshot, LiveQueueItem, Passage

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"


def parse_window(text: str) -> tuple[dt.date, dt.date]:
    first, _, last = text.partition(":")
    a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    if a > b:
        raise SystemExit(f"--window {text}: {a} is after {b}")
    return a, b


def window_articles(data: Path, first: dt.date, last: dt.date, since: dt.date):
    """(articles before the window, the window's articles by day, questions) from the slice."""
    articles, questions, report = read_realtimeqa(data, since=since)
    before = [a for a in articles if a.published < first]
    by_day: dict[dt.date, list] = defaultdict(list)
    for a in articles:
        if first <= a.published <= last:
            by_day[a.published].append(a)
    log(
        f"slice: {len(articles)} articles since {since} ({len(before)} before the window, "
        f"{sum(map(len, by_day.values()))} in it), {len(questions)} questions, {report.skipped_total} skipped"
    )
    return before, by_day, questions


def setup(home: Path, data: Path, first: dt.date, since: dt.date):
    """Import and ingest everything before the window (skipped when the home serves already)."""
    from app.bootstrap.builders import build_encoder, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import ingest_config  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from serving.index_state import latest_snapshot_row  # noqa: PLC0415 (lazy: serving.index_state pulls faiss)
    from workers.imports import store_records  # noqa: PLC0415 (lazy: workers.imports pulls faiss)
    from workers.ingest import ingest  # noqa: PLC0415 (lazy: workers.ingest pulls faiss)

    before, by_day, questions = window_articles(data, first, dt.date(9999, 12, 31), since)
    settings = Settings(home=home)
    db = open_database(settings)
    try:
        with db.sessions() as s:
            ready = latest_snapshot_row(s) is not None
        if not ready:
            t0 = time.perf_counter()
            store_records(db.sessions, before, questions)
            through = (first - dt.timedelta(days=1)).strftime("%Y-%m")
            log(f"setup: ingesting {len(before)} articles through {through} (the encoder's one-off cost)")
            job = ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": through}, bar=True)
            log(f"setup: {job.state} in {time.perf_counter() - t0:.0f} s")
        else:
            log("setup: the home serves already; reused")
    finally:
        db.close()
    return by_day


def reset_stream(home: Path, first: dt.date) -> bool:
    """Take a home back to the end of its setup: the window's articles, their passages, the live queue
    and the snapshots committed after the setup's last ingest go (the setup's shard files are still
    referenced by that snapshot). Returns whether there was anything to take back."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

    db = open_database(Settings(home=home), migrate=False)
    try:
        with db.sessions() as s, s.begin():
            streamed = s.scalar(select(func.count()).select_from(Article).where(Article.published >= first))
            if not streamed:
                return False
            setup_row = s.scalar(select(func.max(IndexSnapshot.id)).where(IndexSnapshot.job_id.is_not(None)))
            s.execute(delete(LiveQueueItem))
            s.execute(delete(Passage).where(Passage.shard_key.like("live-%")))
            s.execute(
                delete(Passage).where(Passage.article_id.in_(select(Article.id).where(Article.published >= first)))
            )
            s.execute(delete(Article).where(Article.published >= first))
            s.execute(delete(IndexSnapshot).where(IndexSnapshot.id > setup_row))
        log(f"reset: {streamed} streamed articles and the snapshots after the setup taken back")
        return True
    finally:
        db.close()


def offline(args, questions) -> tuple[dict, dict]:
    """Schedules (c) ceiling and (a) monthly, on the final index in this process."""
    db, service, snapshot = open_served(args.home)
    ceiling, monthly = {}, {}
    try:
        for i, q in enumerate(questions, 1):
            r = service.answer(q.text, q.asked, 5)
            ceiling[q.qid] = score_row(q, r.answer, [p.dated_text for p in r.passages])
            cutoff = q.asked.replace(day=1) - dt.timedelta(days=1)
            r = service.answer(q.text, q.asked, 5, index_as_of=cutoff)
            monthly[q.qid] = score_row(q, r.answer, [p.dated_text for p in r.passages])
            if i % 25 == 0:
                log(f"offline: {i}/{len(questions)} questions")
    finally:
        db.close()
    return ceiling, monthly


def summary(rows: dict) -> dict:
    n = len(rows) or 1
    return {
        "n": len(rows),
        "em": round(100 * sum(r["em"] for r in rows.values()) / n, 1),
        "f1": round(100 * sum(r["f1"] for r in rows.values()) / n, 1),
        "recall5": round(100 * sum(r["recall5"] for r in rows.values()) / n, 1),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--home", type=Path, default=ROOT / ".sqa-bench-live")
    p.add_argument("--window", default="2023-04-01:2023-06-30")
    p.add_argument("--since", default="2022-06-01", help="articles published before this are not imported")
    p.add_argument("--max-questions", type=int, default=0, help="a --seed sample of the window's questions (0: all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--clients", type=int, default=4, help="load clients during the burst and 2 x --load-days days")
    p.add_argument(
        "--load-days", type=int, default=7, help="days posted at once (the ingest rate), then streamed under load"
    )
    p.add_argument("--probes", type=int, default=2, help="latency probes per day")
    p.add_argument("--port", type=int, default=8765)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if not args.data.is_dir():
        print(
            f"the RealTimeQA slice is not at {args.data} (../shared/data/realtimeqa): nothing to replay",
            file=sys.stderr,
        )
        return 2
    first, last = parse_window(args.window)
    args.home = args.home.resolve()
    args.home.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    by_day = setup(args.home, args.data, first, dt.date.fromisoformat(args.since))
    by_day = {d: v for d, v in by_day.items() if d <= last}
    reset_stream(args.home, first)  # a rerun streams into the home as the setup left it

    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

    db = open_database(Settings(home=args.home), migrate=False)
    try:
        questions, left_out = window_questions(db, first, last, args.max_questions, args.seed)
    finally:
        db.close()
    log(f"{len(questions)} questions in {first}..{last} (left out: {left_out})")
    live = stream(args, by_day, questions, first, last)
    ceiling, monthly = offline(args, questions)
    schedules = {"monthly": monthly, "live": live["rows"], "ceiling": ceiling}
    result = {
        "window": args.window,
        "questions": len(questions),
        "wall_s": round(time.perf_counter() - t0),
        "schedules": {k: summary(v) for k, v in schedules.items()},
        "paired": {},
        **{k: v for k, v in live.items() if k != "rows"},
    }
    print(f"\n{args.window}: {len(questions)} questions (generation subset), each asked as of its day")
    print(f"{'schedule':10s} {'EM':>6s} {'F1':>6s} {'evidence@5':>11s}")
    for name, s in result["schedules"].items():
        print(f"{name:10s} {s['em']:6.1f} {s['f1']:6.1f} {s['recall5']:11.1f}")
    for other in ("monthly", "ceiling"):
        shared = sorted(set(live["rows"]) & set(schedules[other]))
        pr = paired_em(
            {q: bool(live["rows"][q]["em"]) for q in shared}, {q: bool(schedules[other][q]["em"]) for q in shared}
        )
        result["paired"][f"live_vs_{other}"] = pr
        print(f"paired live vs {other}: {describe_paired(pr, 'live', other)}")
    lat = live["latency_ms"]
    print(
        f"arrival -> answerable: p50 {lat.get('p50_ms')} ms, p95 {lat.get('p95_ms')} ms over {lat.get('n')} probes "
        f"({live['probes_missed']} not cited within 120 s)"
    )
    ld = live["load"]
    print(
        f"under load ({ld['clients']} clients, {ld['days']} days): {ld['answers']} answers, {ld['errors']} errors "
        f"({ld['server_errors']} 5xx); ingest {ld['ingest_passages_per_s']} passages/s "
        f"({ld['burst_passages']} passages POSTed at once, searchable after {ld['burst_s']} s)"
    )
    if args.out:
        args.out.write_text(json.dumps({**result, "rows": schedules}, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
