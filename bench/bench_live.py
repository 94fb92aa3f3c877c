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
   live queue is empty, up to --probes articles of the day are asked for by their title and first
   words until an answer as of the day cites them (arrival -> answerable latency, from the POST's answer to the
   first citing answer); then the day's questions are asked over HTTP (schedule b, live). The load
   runs through the burst's days and as many streamed days, then stops.
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
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import httpx

from evaluation.bakeoff import latency_summary
from evaluation.metrics import answer_in_text, exact_match, token_f1
from evaluation.paired import describe_paired, paired_em

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
TOKEN = "bench-live-token"
ADMIN = {"X-Admin-Token": TOKEN}


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


def parse_window(text: str) -> tuple[dt.date, dt.date]:
    first, _, last = text.partition(":")
    a, b = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    if a > b:
        raise SystemExit(f"--window {text}: {a} is after {b}")
    return a, b


def env_for(home: Path, port: int) -> dict:
    env = dict(os.environ)  # SQA_READER, SQA_ENCODER ... as this process has them; the rest set here
    env.update(
        SQA_HOME=str(home),
        SQA_ADMIN_TOKEN=TOKEN,
        SQA_RATE_LIMIT="",
        SQA_SNAPSHOT_POLL_S="1",
        SQA_LIVE_MAX_WAIT_S="1",
        SQA_LIVE_POLL_S="0.5",
        SQA_AUTO_TRAIN="false",
        SQA_DRIFT_ON_INGEST="false",
        SQA_INGEST_CRON="0 0 1 1 *",
        SQA_EVAL_CRON="0 0 2 1 *",
        SQA_ANSWER_QUEUE="64",
        SQA_ANSWER_WAIT_S="600",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def window_articles(data: Path, first: dt.date, last: dt.date, since: dt.date):
    """(articles before the window, the window's articles by day, questions) from the slice."""
    from indexer.importers import read_realtimeqa

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
    from app.bootstrap import build_encoder, ingest_config, open_database
    from serving.index_state import latest_snapshot_row
    from settings import Settings
    from workers.imports import store_records
    from workers.ingest import ingest

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
    from sqlalchemy import delete, func, select

    from app.bootstrap import open_database
    from settings import Settings
    from store.tables import Article, IndexSnapshot, LiveQueueItem, Passage

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


class Load:
    """`n` threads asking random questions over HTTP until stopped; counts answers and errors."""

    def __init__(self, base: str, questions: list, n: int):
        self.base, self.questions, self.n = base, questions, n
        self.stop_event = threading.Event()
        self.ok = self.errors = self.server_errors = 0
        self.lock = threading.Lock()
        self.threads: list[threading.Thread] = []

    def start(self):
        if self.threads or not self.n:
            return
        self.stop_event.clear()
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(self.n)]
        for t in self.threads:
            t.start()

    def _run(self, i: int):
        rng = random.Random(i)
        with httpx.Client(base_url=self.base, timeout=600) as client:
            while not self.stop_event.is_set():
                q = rng.choice(self.questions)
                try:
                    r = client.post("/v1/answers", json={"question": q.text, "as_of": q.asked.isoformat()})
                    ok, server = r.status_code == 200, r.status_code >= 500
                except httpx.HTTPError:
                    ok, server = False, True
                with self.lock:
                    self.ok += ok
                    self.errors += not ok
                    self.server_errors += server

    def stop(self):
        self.stop_event.set()
        for t in self.threads:
            t.join(timeout=600)
        self.threads = []


def start(cmd: list[str], env: dict, logfile: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli", *cmd], cwd=ROOT, env=env, stdout=open(logfile, "w"), stderr=subprocess.STDOUT
    )


def wait_healthy(client: httpx.Client, proc: subprocess.Popen, what: str) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with {proc.returncode}: see its log")
        try:
            if client.get("/admin/live", headers=ADMIN).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise SystemExit(f"{what} did not come up in 10 minutes")


def wait_published(client: httpx.Client, max_polls: int = 1200) -> None:
    for _ in range(max_polls):
        if client.get("/admin/live", headers=ADMIN).json()["waiting"] == 0:
            return
        time.sleep(0.25)
    raise SystemExit("the live queue did not empty in 5 minutes: is the worker running? see its log")


def probe(client: httpx.Client, article, posted: float, max_s: float = 120.0) -> float | None:
    """Seconds from `posted` until an answer as of the article's day cites it (None: not within max_s)."""
    # The title and the first words of the text: a query that finds the article once it is indexed
    # (a title alone misses pages whose text is a teaser), so the wait measured is the ingest's.
    body = {
        "question": f"{article.title} {' '.join(article.text.split()[:40])}",
        "as_of": article.published.isoformat(),
        "top_k": 20,
    }
    while time.monotonic() - posted < max_s:
        r = client.post("/v1/answers", json=body)
        if r.status_code == 200 and any(p["url"] == article.url for p in r.json()["passages"]):
            return time.monotonic() - posted
        time.sleep(0.5)
    return None


def post(client: httpx.Client, arts: list) -> dict[str, float]:
    """POST `arts` in batches of 100; returns when each batch was acknowledged (monotonic s) by url."""
    posted: dict[str, float] = {}
    for i in range(0, len(arts), 100):
        part = arts[i : i + 100]
        body = [
            {
                "url": a.url,
                "title": a.title or a.url,
                "text": a.text,
                "published": a.published.isoformat(),
                "source": a.source or "realtimeqa",
            }
            for a in part
        ]
        r = client.post("/admin/articles", json=body, headers=ADMIN)
        if r.status_code not in (200, 422):
            raise SystemExit(f"POST /admin/articles answered {r.status_code}: {r.text[:300]}")
        now = time.monotonic()
        posted.update({a.url: now for a in part})
    return posted


def opening(text: str) -> str:
    return " ".join(text.split()[:40]).lower()


def pick_probes(arts: list, n: int, openings: dict[str, int]) -> list:
    """Up to n of the day's articles whose title is long and unique that day and whose opening words
    no other article of the slice shares (a wire story under several URLs, or a site's cookie notice
    scraped as the text, is found under another URL: that is not a late ingest)."""
    titles = defaultdict(int)
    for a in arts:
        titles[(a.title or "").strip().lower()] += 1
    return [
        a
        for a in arts
        if a.title
        and len(a.title) > 25
        and titles[a.title.strip().lower()] == 1
        and openings.get(opening(a.text), 0) == 1
    ][:n]


def score_row(q, prediction: str, texts: list[str]) -> dict:
    return {
        "qid": q.qid,
        "prediction": prediction,
        "em": exact_match(prediction, q.answers),
        "f1": token_f1(prediction, q.answers),
        "recall5": float(any(answer_in_text(q.answers, t) for t in texts[:5])),
    }


def stream(args, by_day, questions, first, last) -> dict:
    """Schedule (b): the window streamed through the push API; returns live rows and the measures."""
    env = env_for(args.home, args.port)
    base = f"http://127.0.0.1:{args.port}"
    server = start(["serve", "--port", str(args.port), "--log-level", "warning"], env, args.home / "bench-serve.log")
    worker = start(["worker"], env, args.home / "bench-worker.log")
    by_q = defaultdict(list)
    for q in questions:
        by_q[q.asked].append(q)
    days = sorted(set(by_day) | set(by_q))
    openings = defaultdict(int)
    for arts in by_day.values():
        for a in arts:
            openings[opening(a.text)] += 1
    load = Load(base, questions, args.clients)
    rows, latencies, missed = {}, [], 0
    under_load = {"passages": 0, "seconds": 0.0}
    try:
        with httpx.Client(base_url=base, timeout=600) as client:
            wait_healthy(client, server, "the server")
            # The burst, under load: the first --load-days days' articles at once (the date filter keeps
            # a question from seeing later days, so asking those days' questions afterwards is fair).
            burst, rest = days[: args.load_days], days[args.load_days :]
            load.start()
            vectors0, t_burst = client.get("/admin/index", headers=ADMIN).json()["vectors"], time.monotonic()
            post(client, [a for d in burst for a in by_day.get(d, [])])
            wait_published(client)
            under_load["passages"] = client.get("/admin/index", headers=ADMIN).json()["vectors"] - vectors0
            under_load["seconds"] = time.monotonic() - t_burst
            log(f"burst under load: {under_load['passages']} passages in {under_load['seconds']:.1f} s")
            for i, day in enumerate(burst + rest):
                loaded = i < 2 * args.load_days  # the burst's days, then as many streamed days under load
                if not loaded:
                    load.stop()
                arts = by_day.get(day, []) if day in rest else []
                posted = post(client, arts)
                wait_published(client)
                for a in pick_probes(arts, args.probes, openings):
                    seconds = probe(client, a, posted[a.url])
                    if seconds is None:
                        missed += 1
                    else:
                        latencies.append(seconds)
                for q in by_q.get(day, []):
                    r = client.post("/v1/answers", json={"question": q.text, "as_of": day.isoformat(), "top_k": 5})
                    if r.status_code != 200:
                        raise SystemExit(f"/v1/answers answered {r.status_code}: {r.text[:300]}")
                    body = r.json()
                    rows[q.qid] = score_row(q, body["answer"], [p["text"] for p in body["passages"]])
                lat = latency_summary([x * 1000 for x in latencies])
                log(
                    f"{day}: {len(arts)} articles, {len(by_q.get(day, []))} questions{' under load' if loaded else ''};"
                    f" latency p50 {lat['p50_ms']} ms, p95 {lat['p95_ms']} ms over {lat['n']} ({missed} missed)"
                )
    finally:
        load.stop()
        for proc in (worker, server):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in (worker, server):
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    lat = latency_summary([x * 1000 for x in latencies])
    return {
        "rows": rows,
        "latency_ms": lat,
        "probes_missed": missed,
        "load": {
            "clients": args.clients,
            "days": min(2 * args.load_days, len(days)),
            "burst_passages": under_load["passages"],
            "burst_s": round(under_load["seconds"], 1),
            "answers": load.ok,
            "errors": load.errors,
            "server_errors": load.server_errors,
            "ingest_passages_per_s": round(under_load["passages"] / under_load["seconds"], 2)
            if under_load["seconds"]
            else None,
        },
    }


def offline(args, questions) -> tuple[dict, dict]:
    """Schedules (c) ceiling and (a) monthly, on the final index in this process."""
    from bench.bench_quality import open_served

    db, service, snapshot = open_served(args.home)
    ceiling, monthly = {}, {}
    try:
        for i, q in enumerate(questions, 1):
            r = service.answer(q.text, q.asked, 5)
            ceiling[q.qid] = score_row(q, r.answer, [p.text for p in r.passages])
            cutoff = q.asked.replace(day=1) - dt.timedelta(days=1)
            r = service.answer(q.text, q.asked, 5, index_as_of=cutoff)
            monthly[q.qid] = score_row(q, r.answer, [p.text for p in r.passages])
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

    from app.bootstrap import open_database
    from bench.bench_quality import window_questions
    from settings import Settings

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
