"""The load of bench/bench_scale.py: the sample's dated questions sent back to back, by `clients`
Python clients (httpx threads, with fault events run on the way) or by wrk (C, two threads: a load
generator that leaves the cores to the servers), and the figures of each run: requests/s, p50/p95
and errors.
"""

from __future__ import annotations

import random
import subprocess
import threading
import time
from pathlib import Path

import httpx

from bench.bench_answers import pct

QUESTIONS = [
    ("Who is the mayor of Port Calder?", "2024-03-31"),
    ("Who coaches the Harbor Hawks?", "2024-02-20"),
    ("What did the council approve?", "2024-03-15"),
    ("Who won the regatta?", "2024-01-30"),
]


def load(base: str, clients: int, seconds: float, events: list[tuple[float, callable]] | None = None) -> dict:
    """`clients` clients for `seconds`; `events`: (at second, action) run on the way. Returns figures."""
    results: list[tuple[float, float, int, str]] = []  # (start s, ms, status, detail)
    lock = threading.Lock()
    t_start = time.perf_counter()
    stop = t_start + seconds

    def client(seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(base_url=base, timeout=120) as http:
            while time.perf_counter() < stop:
                question, as_of = rng.choice(QUESTIONS)
                t0 = time.perf_counter()
                try:
                    r = http.post(
                        "/v1/answers", json={"question": question, "as_of": as_of, "top_k": rng.randint(1, 10)}
                    )
                    status, detail = r.status_code, (r.text[:160] if r.status_code != 200 else "")
                except httpx.HTTPError as exc:
                    status, detail = 0, f"{type(exc).__name__}: {exc}"
                with lock:
                    results.append((t0 - t_start, (time.perf_counter() - t0) * 1000, status, detail))

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    for at, action in sorted(events or [], key=lambda e: e[0]):
        time.sleep(max(0.0, t_start + at - time.perf_counter()))
        action()
    for t in threads:
        t.join(timeout=seconds + 180)
    ok = [ms for _, ms, s, _ in results if s == 200]
    refused = sum(1 for _, _, s, _ in results if s == 503)
    errors = [(s, d) for _, _, s, d in results if s not in (200, 503)]
    return {
        "requests": len(results),
        "answered": len(ok),
        "per_s": len(ok) / seconds,
        "refused_503": refused,
        "errors": len(errors),
        "error_examples": errors[:5],
        "p50_ms": pct(ok, 50),
        "p95_ms": pct(ok, 95),
    }


WRK_SCRIPT = """
-- bench_scale's questions, one at random per request (top_k 1..10), as the Python clients send them
local questions = {QUESTIONS}
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
request = function()
  local q = questions[math.random(#questions)]
  local body = string.format('{"question": "%s", "as_of": "%s", "top_k": %d}', q[1], q[2], math.random(1, 10))
  return wrk.format(nil, "/v1/answers", nil, body)
end
done = function(summary, latency, requests)
  io.write(string.format("WRK %d %d %d %d %.3f %.3f\\n", summary.requests, summary.errors.status,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.timeout,
    summary.duration, latency:percentile(50) / 1000, latency:percentile(95) / 1000))
end
"""


def load_wrk(base: str, clients: int, seconds: float, workdir: Path) -> dict:
    """The same load from wrk (C, two threads, `clients` connections): a load generator that leaves
    the cores to the servers, where the Python clients take about one of the two."""
    script = workdir / "answers.lua"
    table = ", ".join(f'{{"{q}", "{d}"}}' for q, d in QUESTIONS)
    script.write_text(WRK_SCRIPT.replace("{QUESTIONS}", "{" + table + "}"))
    out = subprocess.run(
        ["wrk", "-t2", f"-c{clients}", f"-d{int(seconds)}s", "--timeout", "120s", "-s", str(script), base],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    line = next(x for x in out.splitlines() if x.startswith("WRK "))
    requests, non2xx, socket_errors, duration_us, p50, p95 = line.split()[1:]
    answered = int(requests) - int(non2xx) - int(socket_errors)
    return {
        "requests": int(requests),
        "answered": answered,
        "per_s": answered / (int(duration_us) / 1e6),
        "refused_503": "(counted as errors by wrk)",
        "errors": int(non2xx) + int(socket_errors),
        "error_examples": [],
        "p50_ms": float(p50),
        "p95_ms": float(p95),
    }
