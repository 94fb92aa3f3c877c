"""Schemathesis against the whole JSON API: 10,000 generated requests, no 5xx, every response as documented.

    .venv/bin/python bench/bench_fuzz.py [--examples 10000]

It runs tests/app/test_api_fuzz.py (the same checks `make test` runs with 20 examples an operation:
no server error, a documented status code and content type, a body that matches the documented
schema, every error a JSON `detail` with the request id) with enough examples per operation to make
at least --examples requests, over the shipped sample (hash encoder, first-entity reader), admin
routes with the right token. It prints the requests made, the status codes seen, failures and time.
Requests that start background jobs (ingest, evaluation) run them for real.
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = 19  # the JSON API's operations in the OpenAPI schema (the test checks the walk itself)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--examples", type=int, default=10_000, help="at least this many requests in all")
    args = ap.parse_args()
    per_op = math.ceil(args.examples / OPERATIONS * 1.1)  # hypothesis stops early on small input spaces
    with tempfile.TemporaryDirectory() as tmp:
        counts = Path(tmp) / "statuses"
        env = {**os.environ, "SQA_FUZZ_EXAMPLES": str(per_op), "SQA_FUZZ_COUNT_FILE": str(counts)}
        made = 0
        rounds = 0
        t0 = time.perf_counter()
        code = 0
        while made < args.examples and rounds < 5:  # another round with a new seed until enough were made
            rounds += 1
            env["SQA_FUZZ_SEED"] = str(rounds)
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/app/test_api_fuzz.py"],
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
            )
            tail = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]
            print(f"round {rounds}: {per_op} examples an operation: {tail}", flush=True)
            if proc.returncode != 0:
                code = proc.returncode
                print(proc.stdout[-6000:])
                break
            made = len(counts.read_text().split()) if counts.exists() else 0
        took = time.perf_counter() - t0
        statuses = collections.Counter(counts.read_text().split()) if counts.exists() else collections.Counter()
    print(f"requests: {sum(statuses.values())} in {took:.0f} s ({sum(statuses.values()) / took:.0f}/s)")
    print("status codes: " + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    server_errors = sum(v for k, v in statuses.items() if k.startswith("5") and k != "503")
    print(f"server errors (5xx other than a documented 503): {server_errors}")
    print("failures: " + ("none" if code == 0 else "see above"))
    return code or (1 if server_errors else 0)


if __name__ == "__main__":
    sys.exit(main())
