"""Cost per month as the index grows: ingest per passage, snapshot swap, server memory, search time.

    .venv/bin/python bench/bench_growth.py [--months 10] [--per-month 20000] [--encoder hash] [--questions 40]

In a temporary SQA_HOME (SQLite) it ingests synthetic months one after another, each --per-month
passages (articles of invented words, about two passages each), with the real ingest job
(`workers.ingest.ingest`: chunking, encoding, BM25, the shard files, the passages and the
snapshot). A real server (`sqa serve`, hybrid retriever, first-entity reader) runs on the same
home from the first month on. After each month it prints:

- the ingest's seconds and milliseconds per passage (the encoder's share is the same per passage
  whatever the index holds; the hash encoder leaves the rest visible, --encoder minilm adds it);
- the swap: from the snapshot row's created_at (set when the ingest's transaction writes it, so
  the rest of that commit counts too) until the server's /readyz first names it, watched every
  20 ms from a thread while the ingest runs (the server polls the database every 0.1 s); and the
  server's own part, the seconds it took to open and verify the snapshot (`load_s` in /readyz:
  the new shard is read, the others stay loaded);
- the server's RSS;
- retrieval p50 / p95 (the answers' `timings_ms.retrieve`) of --questions dated questions, each
  asked as of a random day of the months indexed so far (the time filter at work).

The target: per-month ingest and swap cost flat (within 20%) from the first month to the last.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
from sqlalchemy import select

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.server_process import served  # noqa: E402
from indexer.records import ArticleRecord  # noqa: E402
from settings import Settings  # noqa: E402
from store.tables import IndexSnapshot  # noqa: E402

WORDS = [f"w{i}" for i in range(20_000)]  # invented words: BM25 and the hash encoder see a real vocabulary
NAMES = ["Port Calder", "Harbor Hawks", "Mayor Lind", "River Council", "Doyle Bank", "Astra Motors"]


def month_articles(month: dt.date, n_passages: int, rng: np.random.Generator):
    """Articles of `month` that the chunker cuts into about n_passages passages (two each)."""
    days = (dt.date(month.year + month.month // 12, month.month % 12 + 1, 1) - month).days
    out = []
    for i in range(n_passages // 2):
        words = rng.integers(0, len(WORDS), size=(12, 14))
        sentences = [
            " ".join(WORDS[w] for w in row).capitalize() + f" {NAMES[(i + k) % len(NAMES)]}."
            for k, row in enumerate(words)
        ]
        out.append(
            ArticleRecord(
                url=f"https://example.org/{month:%Y-%m}/{i}",
                title=f"article {i}",
                text=" ".join(sentences),
                published=month + dt.timedelta(days=int(i % days)),
                source="synthetic",
            )
        )
    return out


class SnapshotWatch:
    """Polls a server's /readyz every 20 ms and notes when it first names each snapshot (UTC)."""

    def __init__(self, base: str):
        self.base, self.seen, self.load_s, self._stop = base, {}, {}, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=30) as http:
            while not self._stop.is_set():
                try:
                    body = http.get("/readyz").json()
                    snap = body.get("snapshot")
                except (httpx.HTTPError, ValueError):
                    snap = None
                if snap and snap not in self.seen:
                    self.seen[snap] = dt.datetime.now(dt.UTC)
                    self.load_s[snap] = body.get("load_s")
                time.sleep(0.02)

    def wait_for(self, snapshot: str, timeout_s: float = 600.0) -> dt.datetime:
        deadline = time.monotonic() + timeout_s
        while snapshot not in self.seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not swap to {snapshot}")
            time.sleep(0.02)
        return self.seen[snapshot]

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=10)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--months", type=int, default=10)
    ap.add_argument("--per-month", type=int, default=20_000, help="passages a month")
    ap.add_argument(
        "--encoder", default="hash", help="SQA_ENCODER (hash: the pipeline's own cost; minilm: with the model)"
    )
    ap.add_argument("--questions", type=int, default=40)
    args = ap.parse_args()

    from app.bootstrap.builders import build_encoder, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import ingest_config  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from workers.imports import store_records  # noqa: PLC0415 (lazy: workers.imports pulls faiss)
    from workers.ingest import ingest  # noqa: PLC0415 (lazy: workers.ingest pulls faiss)

    rng = np.random.default_rng(0)
    pick = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="sqa-growth-") as tmp:
        home = Path(tmp) / "home"
        settings = Settings(home=home, database_url="", encoder=args.encoder, auto_train=False)
        db = open_database(settings)
        encoder, cfg = build_encoder(settings), ingest_config(settings)
        env = {
            **os.environ,
            "SQA_HOME": str(home),
            "SQA_ENCODER": args.encoder,
            "SQA_READER": "first-entity",
            "SQA_SNAPSHOT_POLL_S": "0.1",
            "SQA_RATE_LIMIT": "",
            "SQA_AUTO_TRAIN": "false",
            "SQA_ANSWER_CACHE": "0",  # every answer computed: the pipeline is measured, not the answer cache
        }
        load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
        print(
            f"{args.months} months x {args.per_month} passages, encoder {encoder.name}; {os.cpu_count()} cores, "
            f"load {load}\n",
            flush=True,
        )
        print(
            f"{'month':8s} {'passages':>9s} {'total':>9s} {'ingest s':>9s} "
            f"{'ms/passage':>10s} {'swap s':>7s} {'load s':>7s} "
            f"{'RSS MB':>7s} {'search p50/p95 ms':>18s}",
            flush=True,
        )
        rows, server, stack = [], None, None
        first = dt.date(2024, 1, 1)
        try:
            for m in range(args.months):
                month = dt.date(first.year + (first.month - 1 + m) // 12, (first.month - 1 + m) % 12 + 1, 1)
                store_records(db.sessions, month_articles(month, args.per_month, rng), [])
                t0 = time.perf_counter()
                job = ingest(db.sessions, encoder, cfg, {"month": f"{month:%Y-%m}"})
                ingest_s = time.perf_counter() - t0
                counts = (job.counts or {}).get(f"{month:%Y-%m}", {})
                if job.state != "succeeded" or not counts.get("snapshot"):
                    raise RuntimeError(f"ingest of {month:%Y-%m}: {job.state} {job.message} {job.error or ''}")
                passages = int(counts.get("passages", 0))
                snapshot = counts.get("snapshot")
                if server is None:
                    stack = contextlib.ExitStack()
                    server = stack.enter_context(served(env, Path(tmp) / "server.log"))
                    watch = stack.enter_context(SnapshotWatch(server.base))
                    swap_s = load_s = float("nan")  # the first snapshot is loaded at start
                else:
                    with db.sessions() as session:
                        committed = session.scalars(
                            select(IndexSnapshot.created_at).where(IndexSnapshot.snapshot_id == snapshot)
                        ).one()
                    swap_s = (watch.wait_for(snapshot) - committed).total_seconds()
                    load_s = watch.load_s.get(snapshot) or float("nan")  # the server's own open-and-verify time
                rss = psutil.Process(server.process.pid).memory_info().rss / 2**20
                retrieve = []
                with httpx.Client(base_url=server.base, timeout=120) as http:
                    for _ in range(args.questions):
                        day = first + dt.timedelta(days=pick.randrange((month - first).days + 28))
                        r = http.post(
                            "/v1/answers",
                            json={
                                "question": f"What did {pick.choice(NAMES)} say about "
                                f"{' '.join(pick.sample(WORDS, 3))}?",
                                "as_of": day.isoformat(),
                            },
                        )
                        r.raise_for_status()
                        retrieve.append(r.json()["timings_ms"]["retrieve"])
                total = sum(r["passages"] for r in rows) + passages
                row = {
                    "month": f"{month:%Y-%m}",
                    "passages": passages,
                    "total": total,
                    "ingest_s": ingest_s,
                    "ms_per_passage": 1000 * ingest_s / max(passages, 1),
                    "swap_s": swap_s,
                    "load_s": load_s,
                    "rss_mb": rss,
                    "p50": statistics.median(retrieve),
                    "p95": float(np.percentile(retrieve, 95)),
                }
                rows.append(row)
                print(
                    f"{row['month']:8s} {passages:9d} {total:9d} {ingest_s:9.1f} {row['ms_per_passage']:10.2f} "
                    f"{swap_s:7.2f} {load_s:7.2f} {rss:7.0f} {row['p50']:8.1f} / {row['p95']:6.1f}",
                    flush=True,
                )
        finally:
            if stack is not None:
                stack.close()
            db.close()
    if len(rows) >= 3:
        a, b = rows[1], rows[-1]  # the first month has no swap and pays the one-off imports
        print(
            f"\nfrom {a['month']} ({a['total']} passages) to {b['month']} ({b['total']}): ingest per passage "
            f"{b['ms_per_passage'] / a['ms_per_passage']:.2f}x, swap {b['swap_s'] / a['swap_s']:.2f}x "
            f"(the server's load {b['load_s'] / a['load_s']:.2f}x), "
            f"search p50 {b['p50'] / a['p50']:.2f}x, RSS {b['rss_mb'] / a['rss_mb']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
