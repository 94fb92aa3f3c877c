"""/v1/answers latency through a real server: p50/p95 over N dated questions, sent one at a time
(or from --clients concurrent clients).

    .venv/bin/python bench/bench_answers.py --data ../shared/data/realtimeqa [--n 50]
        [--since 2023-06-01 --until 2023-06-30] [--reader auto|gemma|first-entity] [--encoder minilm]
        [--threads 0] [--max-articles N] [--home PATH] [--json OUT] [--clients 8] [--batch 8]

With --clients N, N clients send the questions at once (each takes the next unsent one): the server
answers SQA_ANSWER_CONCURRENCY at a time, lets SQA_ANSWER_QUEUE wait at most SQA_ANSWER_WAIT_S,
and refuses the rest with 503 + Retry-After. Those refusals are counted apart from errors (they are
by design), with how long a client waited for one: the target is that nobody waits minutes.
The server's answer cache is off (SQA_ANSWER_CACHE=0), so every answer is read, as the figures
before it were; --cache N turns it on with N entries, and the answers served from it are counted
(with --repeat, the later rounds ask the same questions again: a newsroom's repeated questions).
With --batch N the server answers N at a time and reads concurrent questions in batches of up to N
(SQA_ANSWER_CONCURRENCY=N, SQA_READER_BATCH=N: serving/reader_batching.py). The answers per second
are the answered questions over the measured run's wall time; --json also keeps each answer, so two
runs' answers can be compared question by question.

Without --home it builds a temporary SQA_HOME (SQLite), imports the RealTimeQA questions and
articles of [since, until] and ingests those months; with --home it uses that SQA_HOME as it is
(no import, no ingest: its index must already cover the questions). Either way it starts
`sqa serve` as a subprocess on a free port of 127.0.0.1, waits for /readyz, then sends N of the
window's questions (a fixed-seed sample, in date order; questions that only make sense with their
multiple-choice options are left out) one after another, each with as_of = its question date.

It prints client-side latency (p50, p95, mean, max), the server's own timings_ms (queue at the answer gate,
retrieve, read; arrival to answer) and what the client saw beyond them, each
p50/p95, the number of errors and three example answers next to the gold answer. Without the
RealTimeQA data it falls back to the shipped sample (indexer/sample/realtimeqa, invented news),
and says so.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import select

from app.server_process import ServerNotReady, served
from evaluation.subsets import needs_choices
from indexer.importers import read_realtimeqa
from settings import Settings
from store.tables import Question

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"
SAMPLE = ROOT / "indexer" / "sample" / "realtimeqa"


def build_home(
    home: Path, data: Path, since: dt.date | None, until: dt.date | None, encoder: str, max_articles: int = 0
) -> None:
    """Import the window's questions and articles into a fresh SQA_HOME and ingest its months."""
    from app.bootstrap.builders import build_encoder, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import ingest_config  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from workers.imports import store_records  # noqa: PLC0415 (lazy: workers.imports pulls faiss)
    from workers.ingest import ingest  # noqa: PLC0415 (lazy: workers.ingest pulls faiss)

    settings = Settings(home=home, database_url="", encoder=encoder)
    db = open_database(settings)
    try:
        t0 = time.perf_counter()
        articles, questions, _ = read_realtimeqa(data, since=since, until=until)
        if max_articles:
            articles = articles[:max_articles]
        store_records(db.sessions, articles, questions)
        print(
            f"imported {len(articles)} articles, {len(questions)} questions in {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        if not articles:
            raise SystemExit("no articles in the window: nothing to index")
        first = since or min(a.published for a in articles)
        last = until or max(a.published for a in articles)
        t0 = time.perf_counter()
        job = ingest(
            db.sessions,
            build_encoder(settings),
            ingest_config(settings),
            {"through": last.strftime("%Y-%m"), "from": first.strftime("%Y-%m")},
        )
        passages = sum(c["passages"] for k, c in job.counts.items() if isinstance(c, dict))
        print(
            f"ingested {', '.join(job.counts.get('planned', []))}: {passages} passages "
            f"in {time.perf_counter() - t0:.1f} s ({job.state})",
            flush=True,
        )
    finally:
        db.close()


def pick_questions(
    home: Path, database_url: str | None, since: dt.date | None, until: dt.date | None, n: int, seed: int
) -> tuple[list[tuple[str, dt.date, str]], int]:
    """Up to n (text, asked, gold) from the home's database, and how many were left out for needing choices."""
    from app.bootstrap.builders import open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)

    overrides = {} if database_url is None else {"database_url": database_url}
    db = open_database(Settings(home=home, **overrides), migrate=False)
    try:
        with db.sessions() as session:
            query = select(Question).order_by(Question.asked, Question.qid)
            if since:
                query = query.where(Question.asked >= since)
            if until:
                query = query.where(Question.asked <= until)
            rows = [(q.text, q.asked, (q.answers or [""])[0]) for q in session.scalars(query)]
    finally:
        db.close()
    usable = [r for r in rows if not needs_choices(r[0])]
    chosen = random.Random(seed).sample(usable, min(n, len(usable)))
    return sorted(chosen, key=lambda r: (r[1], r[0])), len(rows) - len(usable)


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


STAGES = {
    "queue": "server: queue (gate)",
    "retrieve": "server: retrieve",
    "read": "server: read",
    "server": "server: arrival->answer",
    "outside": "outside the server",
}


def send_questions(server, questions, args):
    """Warm up, then send each question once (from args.clients clients); returns latencies, the
    server's timings per stage (STAGES), errors, examples and the 503 refusals' waits."""
    latencies, errors, examples, refused = [], [], [], []
    answers: list[dict] = []  # each answered question's answer, in the order answered
    stages: dict[str, list[float]] = {name: [] for name in STAGES}  # the server's timings_ms, and the rest
    lock = threading.Lock()
    pending = iter(enumerate(questions))

    def client_loop() -> None:
        with httpx.Client(base_url=server.base, timeout=args.request_timeout) as client:
            while True:
                with lock:
                    item = next(pending, None)
                if item is None:
                    return
                i, (text, asked, gold) = item
                body = {"question": text, "as_of": asked.isoformat()}
                if args.top_k is not None:
                    body["top_k"] = args.top_k
                t0 = time.perf_counter()
                try:
                    r = client.post("/v1/answers", json=body)
                except httpx.HTTPError as exc:
                    with lock:
                        errors.append(f"{asked} {text[:60]!r}: {type(exc).__name__}: {exc}")
                    continue
                elapsed_ms = (time.perf_counter() - t0) * 1000
                with lock:
                    if r.status_code == 503 and "retry-after" in r.headers and "busy" in r.text:
                        refused.append(elapsed_ms)
                    elif r.status_code != 200:
                        errors.append(f"{asked} {text[:60]!r}: HTTP {r.status_code} {r.text[:120]}")
                    else:
                        out = r.json()
                        latencies.append(elapsed_ms)
                        timings = out["timings_ms"]
                        for name in ("queue", "retrieve", "read"):  # an answer from the cache was not read
                            if name in timings:
                                stages[name].append(timings[name])
                        # in the server: from arrival to the answer; outside: the HTTP round trip, the
                        # event loop, the client's own threads (what the client saw beyond the server)
                        inside = timings.get("queue", 0.0) + timings.get("total", float("nan"))
                        stages["server"].append(inside)
                        stages["outside"].append(elapsed_ms - inside)
                        answers.append(
                            {
                                "question": text,
                                "as_of": asked.isoformat(),
                                "answer": out["answer"],
                                "cached": out["cached"],
                                "client_ms": round(elapsed_ms, 1),
                            }
                        )
                        if len(examples) < 3:
                            examples.append((asked, text, out["answer"], gold))
                    if sys.stdout.isatty():
                        print(f"  {i + 1:3d}/{len(questions)}  {elapsed_ms:8.0f} ms", end="\r", flush=True)

    with httpx.Client(base_url=server.base, timeout=args.request_timeout) as client:
        for text, asked, _ in questions[: max(args.warmup, 0)]:
            try:
                client.post("/v1/answers", json={"question": text, "as_of": asked.isoformat()})
            except httpx.HTTPError:
                pass  # the measured loop counts errors
    t_start = time.perf_counter()
    with ThreadPoolExecutor(max(1, args.clients)) as pool:
        for f in [pool.submit(client_loop) for _ in range(max(1, args.clients))]:
            f.result()
    wall_s = time.perf_counter() - t_start
    if sys.stdout.isatty():
        print(" " * 40, end="\r")
    if server.process.poll() is not None:
        print(
            f"the server exited during the run (code {server.process.returncode})\n{server.log_tail()}", file=sys.stderr
        )
    return latencies, stages, errors, examples, refused, answers, wall_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data", default=str(DEFAULT_DATA), help="RealTimeQA clone or slice (default ../shared/data/realtimeqa)"
    )
    ap.add_argument("--since", default="2023-06-01", help="YYYY-MM-DD: first question and article day")
    ap.add_argument("--until", default="2023-06-30", help="YYYY-MM-DD: last question and article day")
    ap.add_argument("--n", type=int, default=50, help="questions to send (default 50)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="requests sent first and left out of the figures (the first one pays lazy loading)",
    )
    ap.add_argument("--seed", type=int, default=0, help="seed of the question sample")
    ap.add_argument("--top-k", type=int, default=None, help="top_k sent with each question (default: the server's)")
    ap.add_argument("--encoder", default=os.environ.get("SQA_ENCODER", "minilm"), help="SQA_ENCODER (default minilm)")
    ap.add_argument(
        "--reader",
        default=os.environ.get("SQA_READER", "auto"),
        help="SQA_READER: auto (default: what `sqa serve` serves, the active trained version or "
        "zero-shot Gemma), gemma, or first-entity (a fast fake, for a quick run)",
    )
    ap.add_argument(
        "--threads",
        type=int,
        default=int(os.environ.get("SQA_TORCH_THREADS", "0")),
        help="SQA_TORCH_THREADS for the server (0: torch's default, one per core)",
    )
    ap.add_argument(
        "--max-articles",
        type=int,
        default=0,
        help="import only the first N articles of the window (0: all; for a quick run)",
    )
    ap.add_argument("--home", help="reuse this SQA_HOME as it is (no import, no ingest)")
    ap.add_argument("--ready-timeout", type=float, default=300, help="seconds to wait for /readyz")
    ap.add_argument("--request-timeout", type=float, default=300, help="seconds allowed per request")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    ap.add_argument("--clients", type=int, default=1, help="concurrent clients (default 1: one question at a time)")
    ap.add_argument("--repeat", type=int, default=1, help="send the question sample this many times (a longer load)")
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        help="answer this many at a time and read concurrent questions in batches of up to this many "
        "(SQA_ANSWER_CONCURRENCY and SQA_READER_BATCH; default 0: the caller's environment or the defaults)",
    )
    ap.add_argument(
        "--cache",
        type=int,
        default=0,
        help="SQA_ANSWER_CACHE for the server: answers kept for a question asked again "
        "(default 0: off, every answer read)",
    )
    args = ap.parse_args()
    if args.n < 1:
        ap.error("--n must be at least 1")

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    since, until = dt.date.fromisoformat(args.since), dt.date.fromisoformat(args.until)
    data = Path(args.data)
    if args.home:
        source = f"the existing SQA_HOME {args.home}"
    elif data.is_dir():
        source = f"RealTimeQA {since}..{until} from {data}"
    else:
        print(
            f"No RealTimeQA data at {data}: FALLING BACK to the shipped sample {SAMPLE} "
            "(36 invented articles, 2024-01..03; the whole sample, --since/--until ignored)."
        )
        data, since, until = SAMPLE, None, None
        source = f"the shipped sample {SAMPLE}"

    with tempfile.TemporaryDirectory(prefix="sqa-bench-answers-") as tmp:
        home = Path(args.home).expanduser().resolve() if args.home else Path(tmp) / "home"
        if not args.home:
            build_home(home, data, since, until, args.encoder, args.max_articles)
        # A reused home keeps the caller's SQA_DATABASE_URL; a temporary one is always its own SQLite file.
        questions, left_out = pick_questions(home, None if args.home else "", since, until, args.n, args.seed)
        if not questions:
            print(f"no usable questions in {source} for {since}..{until}; nothing to measure")
            return 0
        questions = questions * max(1, args.repeat)

        env = {
            **os.environ,
            "SQA_HOME": str(home),
            "SQA_ENCODER": args.encoder,
            "SQA_READER": args.reader,
            "SQA_TORCH_THREADS": str(args.threads),
            "SQA_ANSWER_CACHE": str(max(0, args.cache)),
        }
        if args.batch:
            env.update(SQA_ANSWER_CONCURRENCY=str(args.batch), SQA_READER_BATCH=str(args.batch))
        if not args.home:
            env["SQA_DATABASE_URL"] = ""  # the temporary home's SQLite file, whatever the caller's env says
        print(
            f"starting sqa serve (encoder {args.encoder}, reader {args.reader}, "
            f"torch threads {args.threads or 'default'})",
            flush=True,
        )
        try:
            with served(env, Path(tmp) / "server.log", ready_timeout_s=args.ready_timeout) as server:
                startup_s = server.startup_s
                print(f"ready in {startup_s:.1f} s: {server.ready}", flush=True)
                latencies, stages, errors, examples, refused, answers, wall_s = send_questions(server, questions, args)
        except ServerNotReady as exc:
            print(f"the server did not become ready: {exc}", file=sys.stderr)
            return 1

    figures = {
        "source": source,
        "window": [str(since), str(until)],
        "encoder": args.encoder,
        "reader": args.reader,
        "torch_threads": args.threads,
        "warmup": args.warmup,
        "questions": len(questions),
        "left_out_need_choices": left_out,
        "ok": len(latencies),
        "errors": len(errors),
        "cpu_count": os.cpu_count(),
        "loadavg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "server_startup_s": round(startup_s, 2),
        "client_ms": {
            "p50": pct(latencies, 50),
            "p95": pct(latencies, 95),
            "mean": sum(latencies) / len(latencies) if latencies else float("nan"),
            "max": max(latencies, default=float("nan")),
        },
        **{
            f"{name}_ms": {"p50": pct(v, 50), "p95": pct(v, 95), "max": max(v, default=float("nan"))}
            for name, v in stages.items()
        },
        "clients": args.clients,
        "concurrency": env.get("SQA_ANSWER_CONCURRENCY", "default"),
        "reader_batch": env.get("SQA_READER_BATCH", "default"),
        "wall_s": round(wall_s, 2),
        "answers_per_s": len(latencies) / wall_s if wall_s > 0 else float("nan"),
        "answer_cache": max(0, args.cache),
        "from_cache": sum(1 for a in answers if a["cached"]),
        "refused_503": len(refused),
        "refused_wait_ms": {"p50": pct(refused, 50), "max": max(refused, default=float("nan"))},
        "answers": answers,
    }
    print(f"\n/v1/answers latency: {source}")
    print(
        f"encoder {args.encoder}, reader {args.reader}, torch threads {args.threads or 'default'}; "
        f"{len(questions)} questions sent "
        f"{'one at a time' if args.clients <= 1 else f'by {args.clients} concurrent clients'} "
        f"({left_out} in the window left out: they need their choices; "
        f"{args.warmup} warm-up request(s) not counted); server ready in {startup_s:.1f} s"
    )
    print(f"machine: {os.cpu_count()} cores, load average {' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print()
    print(f"  {'':<24}{'p50':>9}{'p95':>9}{'mean':>9}{'max':>9}   (ms)")
    c = figures["client_ms"]
    print(f"  {'client, end to end':<24}{c['p50']:9.0f}{c['p95']:9.0f}{c['mean']:9.0f}{c['max']:9.0f}")
    for name, label in STAGES.items():
        f = figures[f"{name}_ms"]
        print(f"  {label:<24}{f['p50']:9.1f}{f['p95']:9.1f}{'':>9}{f['max']:9.1f}")
    if args.clients > 1:
        r = figures["refused_wait_ms"]
        print(
            f"  answered: {len(latencies)}; refused with 503 + Retry-After (by design): {len(refused)}"
            + (f", after {r['p50']:.0f} ms p50, {r['max']:.0f} ms at most" if refused else "")
        )
    print(
        f"  {len(latencies)} answered in {wall_s:.1f} s: {figures['answers_per_s']:.2f} answers/s "
        f"(SQA_ANSWER_CONCURRENCY {figures['concurrency']}, SQA_READER_BATCH {figures['reader_batch']})"
    )
    if args.cache:
        hit_ms = [a["client_ms"] for a in answers if a["cached"]]
        read_ms = [a["client_ms"] for a in answers if not a["cached"]]
        print(
            f"  served from the answer cache (SQA_ANSWER_CACHE {args.cache}): {len(hit_ms)} of {len(latencies)}, "
            f"client p50 / p95 {pct(hit_ms, 50):.0f} / {pct(hit_ms, 95):.0f} ms; "
            f"the {len(read_ms)} read: {pct(read_ms, 50):.0f} / {pct(read_ms, 95):.0f} ms"
        )
    print(f"\n  errors: {len(errors)} of {len(questions)}")
    for e in errors[:5]:
        print(f"    {e}")
    if examples:
        print("\nexamples:")
        for asked, text, answer, gold in examples:
            print(f"  Q ({asked}): {text}\n     answer: {answer or '(no answer)'}    gold: {gold}")
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
