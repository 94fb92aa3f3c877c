"""Schedule (b) of bench/bench_live.py, live: `sqa serve` and `sqa worker` started on 127.0.0.1, the
window's news POSTed day by day through /admin/articles under a load of clients asking questions,
latency probes from an article's arrival to the first answer that cites it, and each day's questions
asked over HTTP as soon as its articles are published; with `log`, the timestamped line every part
of the replay prints.
"""

from __future__ import annotations

import datetime as dt
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
from indexer.chunking import dated_text

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-live-token"
ADMIN = {"X-Admin-Token": TOKEN}


def log(message: str) -> None:
    print(f"[{dt.datetime.now():%H:%M:%S}] {message}", flush=True)


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
        SQA_ANSWER_CACHE="0",  # every answer computed: the pipeline is measured, not the answer cache
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


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


def run_probes(base: str, picked: list, posted: dict[str, float]) -> list[float | None]:
    """The day's probes at once, each on its own connection, so one's wait is not added to another's."""
    results: list[float | None] = [None] * len(picked)

    def one(k: int, article) -> None:
        with httpx.Client(base_url=base, timeout=600) as own:
            results[k] = probe(own, article, posted[article.url])

    threads = [threading.Thread(target=one, args=(k, a)) for k, a in enumerate(picked)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


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
                seconds = run_probes(base, pick_probes(arts, args.probes, openings), posted)
                missed += sum(x is None for x in seconds)
                latencies.extend(x for x in seconds if x is not None)
                for q in by_q.get(day, []):
                    r = client.post("/v1/answers", json={"question": q.text, "as_of": day.isoformat(), "top_k": 5})
                    if r.status_code != 200:
                        raise SystemExit(f"/v1/answers answered {r.status_code}: {r.text[:300]}")
                    body = r.json()
                    texts = [dated_text(p["text"], dt.date.fromisoformat(p["published"])) for p in body["passages"]]
                    rows[q.qid] = score_row(q, body["answer"], texts)  # recall as measured before: dated texts
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
