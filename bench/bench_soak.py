"""Soak: a real `sqa serve` kept at saturation for --minutes; errors, latency and memory over time.

    .venv/bin/python bench/bench_soak.py [--minutes 10] [--clients 8] [--reader first-entity]
        [--encoder hash] [--data ../shared/data/realtimeqa --since 2023-06-01 --until 2023-06-30]

It builds a temporary SQA_HOME (the shipped sample by default, or a RealTimeQA window with --data),
starts the server as a subprocess, and --clients clients send dated questions back to back (each a
random stored question, as of its date, with a random top_k in 1..20) for --minutes. Every
--every seconds it samples the server's resident memory (RSS, with its children) and prints a line.

It reports requests, throughput, errors (anything but 200, other than the admission gate's 503 +
Retry-After, which is a refusal by design and counted apart), client latency p50/p95/max for the
whole run and per fifth of it, and RSS growth after warm-up (the first --warmup-fraction of the
run): the targets are 0 errors and growth under 10%. The defaults (hash encoder, first-entity
reader) put the load on the serving machinery (HTTP, admission, retrieval, the database), not on a
model; --reader gemma --encoder minilm soaks the default models, far fewer requests a minute.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.server_process import ServerNotReady, served  # noqa: E402
from bench.bench_answers import SAMPLE, build_home, pct, pick_questions  # noqa: E402


def rss_mb(pid: int) -> float:
    proc = psutil.Process(pid)
    total = proc.memory_info().rss
    for child in proc.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0, help="how long to keep the load on (default 10)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent clients, each sending back to back")
    ap.add_argument("--encoder", default="hash", help="SQA_ENCODER (default hash: the load is on the service)")
    ap.add_argument("--reader", default="first-entity", help="SQA_READER (default first-entity)")
    ap.add_argument("--data", help="a RealTimeQA clone or slice (default: the shipped sample)")
    ap.add_argument("--since", default="2023-06-01", help="with --data: first day of the window")
    ap.add_argument("--until", default="2023-06-30", help="with --data: last day of the window")
    ap.add_argument("--every", type=float, default=15.0, help="seconds between memory samples")
    ap.add_argument("--warmup-fraction", type=float, default=0.2, help="share of the run before the RSS baseline")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.data:
        data, since, until = Path(args.data), dt.date.fromisoformat(args.since), dt.date.fromisoformat(args.until)
        if not data.is_dir():
            print(f"no RealTimeQA data at {data}", file=sys.stderr)
            return 2
    else:
        data, since, until = SAMPLE, None, None
    duration = args.minutes * 60
    with tempfile.TemporaryDirectory(prefix="sqa-soak-") as tmp:
        home = Path(tmp) / "home"
        build_home(home, data, since, until, args.encoder)
        questions, _ = pick_questions(home, "", since, until, 10_000, args.seed)
        env = {
            **os.environ,
            "SQA_HOME": str(home),
            "SQA_DATABASE_URL": "",
            "SQA_ENCODER": args.encoder,
            "SQA_READER": args.reader,
            "SQA_RATE_LIMIT": "",
            "SQA_SNAPSHOT_POLL_S": "5",
            "SQA_ANSWER_CACHE": "0",  # every answer computed: the pipeline is measured, not the answer cache
        }
        try:
            with served(env, Path(tmp) / "server.log") as server:
                print(
                    f"server ready in {server.startup_s:.1f} s; {len(questions)} questions; {args.clients} clients "
                    f"for {args.minutes:g} min (encoder {args.encoder}, reader {args.reader})",
                    flush=True,
                )
                samples: list[tuple[float, int, float]] = []  # (elapsed s, requests so far, RSS MB)
                results: list[tuple[float, float, int]] = []  # (start elapsed s, latency ms, status)
                errors: list[str] = []
                lock = threading.Lock()
                t_start = time.perf_counter()
                stop = t_start + duration

                def client(seed: int) -> None:
                    rng = random.Random(seed)
                    with httpx.Client(base_url=server.base, timeout=120) as http:
                        while time.perf_counter() < stop:
                            text, asked, _ = rng.choice(questions)
                            body = {"question": text, "as_of": asked.isoformat(), "top_k": rng.randint(1, 20)}
                            t0 = time.perf_counter()
                            try:
                                r = http.post("/v1/answers", json=body)
                                status, detail = r.status_code, r.text[:160]
                            except httpx.HTTPError as exc:
                                status, detail = 0, f"{type(exc).__name__}: {exc}"
                            ms = (time.perf_counter() - t0) * 1000
                            with lock:
                                results.append((t0 - t_start, ms, status))
                                refused = status == 503 and "retry-after" in r.headers if status else False
                                if status != 200 and not refused:
                                    errors.append(f"HTTP {status}: {detail}")

                threads = [
                    threading.Thread(target=client, args=(args.seed + i,), daemon=True) for i in range(args.clients)
                ]
                for t in threads:
                    t.start()
                while time.perf_counter() < stop:
                    time.sleep(min(args.every, max(0.0, stop - time.perf_counter())))
                    elapsed = time.perf_counter() - t_start
                    with lock:
                        n = len(results)
                    samples.append((elapsed, n, rss_mb(server.process.pid)))
                    print(
                        f"  {elapsed:6.0f} s  {n:7d} requests  RSS {samples[-1][2]:7.1f} MB  errors {len(errors)}",
                        flush=True,
                    )
                for t in threads:
                    t.join(timeout=180)
                if server.process.poll() is not None:
                    errors.append(f"the server exited (code {server.process.returncode})")
        except ServerNotReady as exc:
            print(f"the server did not become ready: {exc}", file=sys.stderr)
            return 1

    ok = [ms for _, ms, s in results if s == 200]
    refused = sum(1 for _, _, s in results if s == 503)
    warm = [s for s in samples if s[0] >= args.warmup_fraction * duration]
    base_rss = warm[0][2] if warm else float("nan")
    end_rss = samples[-1][2] if samples else float("nan")
    growth = 100 * (end_rss - base_rss) / base_rss if warm else float("nan")
    print(
        f"\nsoak: {args.minutes:g} min, {args.clients} clients, encoder {args.encoder}, reader {args.reader}; "
        f"{os.cpu_count()} cores"
    )
    print(
        f"requests: {len(results)} ({len(results) / duration:.1f}/s); answered {len(ok)}, refused by design (503) "
        f"{refused}, errors {len(errors)}"
    )
    print(
        f"latency ms, whole run: p50 {pct(ok, 50):.0f}  p95 {pct(ok, 95):.0f}  max {max(ok, default=float('nan')):.0f}"
    )
    for i in range(5):
        lo, hi = i * duration / 5, (i + 1) * duration / 5
        part = [ms for t, ms, s in results if s == 200 and lo <= t < hi]
        print(f"  fifth {i + 1}: {len(part):6d} answered  p50 {pct(part, 50):6.0f}  p95 {pct(part, 95):6.0f}")
    print(
        f"RSS: {samples[0][2] if samples else float('nan'):.1f} MB at the first sample, {base_rss:.1f} MB after "
        f"warm-up, {end_rss:.1f} MB at the end, peak {max((s[2] for s in samples), default=float('nan')):.1f} MB: "
        f"growth after warm-up {growth:+.1f}% (target < 10%)"
    )
    for e in errors[:5]:
        print(f"  error: {e}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
