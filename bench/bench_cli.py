"""Start-up time of the short `sqa` commands, against the interpreter's own start.

    .venv/bin/python bench/bench_cli.py [--runs 7] [--json OUT]

In a temporary SQA_HOME with the default settings (SQLite, the packaged MiniLM encoder), it imports
the shipped sample and ingests it (`sqa ingest --through 2024-03 --no-train`), then runs each
command --runs times as a user would (a new process each time) and prints the median and the
slowest wall time. The floor is `python -c pass` in the same virtualenv; `import typer` is the
CLI framework alone. Targets: `sqa --help` < 0.5 s; `sqa index status`, `sqa models list` < 1 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SQA = [sys.executable, "-m", "app.cli"]
COMMANDS = [
    ("python -c pass (floor)", [sys.executable, "-c", "pass"]),
    ("python -c 'import typer'", [sys.executable, "-c", "import typer"]),
    ("sqa --help", SQA + ["--help"]),
    ("sqa index status", SQA + ["index", "status"]),
    ("sqa models list", SQA + ["models", "list"]),
    ("sqa jobs list", SQA + ["jobs", "list"]),
    ("sqa encoders list", SQA + ["encoders", "list"]),
    ("sqa rerankers list", SQA + ["rerankers", "list"]),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="sqa-cli-") as home:
        env = {**os.environ, "SQA_HOME": home, "SQA_AUTO_TRAIN": "false"}
        for setup in (
            ["import", "realtimeqa", str(ROOT / "indexer" / "sample" / "realtimeqa")],
            ["ingest", "--through", "2024-03", "--no-train"],
        ):
            subprocess.run(SQA + setup, env=env, cwd=ROOT, check=True, capture_output=True)
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"{os.cpu_count()} cores, load {load}; {args.runs} runs each, a new process every run\n")
        print(f"{'command':28s} {'median s':>9s} {'max s':>7s} {'vs floor':>9s}")
        rows, floor = [], None
        for label, cmd in COMMANDS:
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
                times.append(time.perf_counter() - t0)
                if done.returncode != 0:
                    print(f"{label}: exit {done.returncode}: {done.stderr[-300:]}", file=sys.stderr)
                    return 1
            median = statistics.median(times)
            floor = floor or median
            rows.append({"command": label, "median_s": round(median, 3), "max_s": round(max(times), 3)})
            print(f"{label:28s} {median:9.2f} {max(times):7.2f} {median / floor:8.1f}x")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
