"""Ingest throughput (passages/s, end to end) against the encoder alone on the same passages.

    .venv/bin/python bench/bench_ingest.py --data ../shared/data/realtimeqa [--since 2023-06-01 --until 2023-06-30]
        [--max-articles N] [--encoder minilm] [--backend torch|onnx|onnx-int8] [--batch-size 0]
        [--threads 0] [--json OUT]

In a temporary SQA_HOME (SQLite) it imports the RealTimeQA articles published in [since, until],
runs the real ingest job (`workers.ingest.ingest`, the one `sqa ingest` runs) over those months and
reports what the job recorded: articles, passages, seconds per stage (chunk, encode, commit) and
passages/s over the three stages. Then, on exactly the same passage texts (the same articles, read
back in the job's order, re-chunked with `chunk_texts`; checked equal to the stored passages), it
times the encoder alone: one `encode_passages` call over all texts with the same batch size (the
ceiling), and the same call made slice by slice as the ingest makes it. The ratio ingest/ceiling says
how much of the encoder's speed the ingest keeps. The encoder is warmed up once before either.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from indexer.chunking import chunk_texts, dated_text
from indexer.importers import read_realtimeqa
from models.onnx_encoder import CPU_BATCH
from settings import Settings
from store.tables import Article, Passage

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"


def cores() -> str:
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return f"{os.cpu_count()} cores ({usable} usable), load average {load} (1/5/15 min)"


def read_back(sf, keys: list[str]) -> list[tuple[str, dt.date]]:
    """(text, published) of the articles each planned shard read, in the ingest job's own order."""
    from workers.ingest_plans import ShardPlan  # noqa: PLC0415 (lazy: workers.ingest_plans pulls faiss)

    out = []
    with sf() as session:
        for key in keys:
            plan = ShardPlan.from_key(key)
            out += session.execute(
                select(Article.text, Article.published)
                .where(Article.published.between(plan.first, plan.last))
                .order_by(Article.published, Article.id)
            ).all()
    return [(text, published) for text, published in out]


def stored_passages(sf) -> list[str]:
    with sf() as session:
        return list(session.scalars(select(Passage.text).order_by(Passage.id)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--data", default=str(DEFAULT_DATA), help="RealTimeQA clone or slice (default ../shared/data/realtimeqa)"
    )
    ap.add_argument("--since", default="2023-06-01", help="YYYY-MM-DD, first publication day imported")
    ap.add_argument("--until", default="2023-06-30", help="YYYY-MM-DD, last publication day imported")
    ap.add_argument(
        "--max-articles", type=int, default=0, help="import only the first N articles of the window (0: all)"
    )
    ap.add_argument("--encoder", default="minilm", help="SQA_ENCODER value (default minilm)")
    ap.add_argument("--batch-size", type=int, default=0, help="encode batch size (SQA_ENCODE_BATCH_SIZE)")
    ap.add_argument(
        "--backend",
        default="torch",
        choices=["torch", "onnx", "onnx-int8"],
        help="SQA_ENCODER_BACKEND: what runs the encoder's model (default torch)",
    )
    ap.add_argument("--threads", type=int, default=0, help="torch threads (SQA_TORCH_THREADS; 0: torch's default)")
    ap.add_argument("--skip-sliced", action="store_true", help="skip timing the encoder slice by slice")
    ap.add_argument("--json", metavar="OUT", help="also write the figures to this JSON file")
    args = ap.parse_args()

    batch = args.batch_size or CPU_BATCH  # 0: the encoder's own choice, 8 on a CPU

    data = Path(args.data)
    if not data.is_dir():
        print(f"No RealTimeQA data at {data}: nothing to measure (pass --data PATH). Skipping.")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    since, until = dt.date.fromisoformat(args.since), dt.date.fromisoformat(args.until)

    import torch  # noqa: PLC0415 (lazy: torch, after the HF offline variables are set)

    from app.bootstrap.builders import build_encoder, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from app.bootstrap.job_configs import ingest_config  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from workers.imports import store_records  # noqa: PLC0415 (lazy: workers.imports pulls faiss)
    from workers.ingest import ingest  # noqa: PLC0415 (lazy: workers.ingest pulls faiss)

    with tempfile.TemporaryDirectory(prefix="sqa-bench-ingest-") as home:
        settings = Settings(
            home=Path(home),
            database_url="",
            encoder=args.encoder,
            encode_batch_size=args.batch_size,
            torch_threads=args.threads,
            encoder_backend=args.backend,
        )
        db = open_database(settings)
        try:
            t0 = time.perf_counter()
            articles, _, report = read_realtimeqa(data, since=since, until=until)
            if args.max_articles:
                articles = articles[: args.max_articles]
            if not articles:
                print(f"No articles published in {since}..{until} under {data}. Skipping.")
                return 0
            store_records(db.sessions, articles, [])
            import_s = time.perf_counter() - t0

            t0 = time.perf_counter()
            encoder = build_encoder(settings)
            load_s = time.perf_counter() - t0
            encoder.encode_passages(["Thursday, June 1, 2023. A warm-up sentence."] * batch, batch_size=args.batch_size)

            cfg = ingest_config(settings)
            params = {"through": until.strftime("%Y-%m"), "from": since.strftime("%Y-%m")}
            t0 = time.perf_counter()
            job = ingest(db.sessions, encoder, cfg, params)
            ingest_wall_s = time.perf_counter() - t0
            if job.state != "succeeded":
                print(f"the ingest job ended {job.state}: {job.error or job.message}", file=sys.stderr)
                return 1
            keys = list(job.counts.get("planned", []))
            per_key = [(job.counts[k], job.timings[k]) for k in keys]
            n_articles = sum(c["articles"] for c, _ in per_key)
            n_passages = sum(c["passages"] for c, _ in per_key)
            stage = {s: sum(t[s] for _, t in per_key) for s in ("chunk_s", "encode_s", "commit_s")}
            stages_s = sum(stage.values())

            # The same passages, outside the job: same articles, same order, same chunker.
            docs = read_back(db.sessions, keys)
            t0 = time.perf_counter()
            chunks = chunk_texts([text for text, _ in docs])
            rechunk_s = time.perf_counter() - t0
            same = [p for passages in chunks for p in passages] == stored_passages(db.sessions)
            # what the job's encoder read: each passage's dated text
            texts = [dated_text(p, day) for (_, day), passages in zip(docs, chunks) for p in passages]

            t0 = time.perf_counter()
            vectors = encoder.encode_passages(texts, batch_size=args.batch_size)  # (n, dim)
            ceiling_s = time.perf_counter() - t0
            sliced_s = None
            if not args.skip_sliced:
                t0 = time.perf_counter()
                for s in range(0, len(texts), batch):
                    encoder.encode_passages(texts[s : s + batch], batch_size=args.batch_size)
                sliced_s = time.perf_counter() - t0
        finally:
            db.close()

    rate = lambda seconds: len(texts) / seconds if seconds > 0 else float("nan")  # noqa: E731
    ingest_rate = n_passages / stages_s if stages_s > 0 else float("nan")
    ceiling = rate(ceiling_s)
    figures = {
        "window": [since.isoformat(), until.isoformat()],
        "shards": keys,
        "articles": n_articles,
        "passages": n_passages,
        "encoder": encoder.name,
        "backend": args.backend,
        "dim": int(vectors.shape[1]),
        "batch_size": args.batch_size,
        "checkpoint_every": cfg.checkpoint_every,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "loadavg_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "import_s": round(import_s, 3),
        "encoder_load_s": round(load_s, 3),
        **{k: round(v, 3) for k, v in stage.items()},
        "ingest_stages_s": round(stages_s, 3),
        "ingest_wall_s": round(ingest_wall_s, 3),
        "ingest_passages_per_s": round(ingest_rate, 2),
        "rechunk_s": round(rechunk_s, 3),
        "same_passages": same,
        "encoder_alone_s": round(ceiling_s, 3),
        "ceiling_passages_per_s": round(ceiling, 2),
        "encoder_sliced_s": None if sliced_s is None else round(sliced_s, 3),
        "sliced_passages_per_s": None if sliced_s is None else round(rate(sliced_s), 2),
        "ingest_over_ceiling": round(ingest_rate / ceiling, 3) if ceiling > 0 else None,
    }

    print(f"\nIngest benchmark: RealTimeQA {since}..{until} from {data}")
    print(f"machine: {cores()}; torch threads {figures['torch_threads']}")
    print(
        f"encoder: {encoder.name} on {args.backend} ({figures['dim']} dims, loaded in {load_s:.1f} s), "
        f"batch size {args.batch_size}, "
        f"checkpoint every {cfg.checkpoint_every} passages"
    )
    print(
        f"imported {len(articles)} articles in {import_s:.1f} s (skipped records: {report.skipped_total}); "
        f"shards built: {', '.join(keys) or '-'}"
    )
    print()
    rows = [
        ("articles", f"{n_articles}", ""),
        ("passages", f"{n_passages}", ""),
        ("ingest: chunk", f"{stage['chunk_s']:.2f} s", ""),
        ("ingest: encode", f"{stage['encode_s']:.2f} s", ""),
        ("ingest: commit", f"{stage['commit_s']:.2f} s", ""),
        ("ingest: chunk+encode+commit", f"{stages_s:.2f} s", f"{ingest_rate:.1f} passages/s"),
        ("ingest: whole job call", f"{ingest_wall_s:.2f} s", f"{n_passages / ingest_wall_s:.1f} passages/s"),
        ("re-chunk alone", f"{rechunk_s:.2f} s", "same passages: " + ("yes" if same else "NO")),
        ("encoder alone, one call (ceiling)", f"{ceiling_s:.2f} s", f"{ceiling:.1f} passages/s"),
    ]
    if sliced_s is not None:
        rows.append(("encoder alone, ingest's slices", f"{sliced_s:.2f} s", f"{rate(sliced_s):.1f} passages/s"))
    rows.append(("ingest / ceiling", f"{figures['ingest_over_ceiling']:.2f}", ""))
    width = max(len(r[0]) for r in rows)
    for name, value, extra in rows:
        print(f"  {name:<{width}}  {value:>10}  {extra}")
    if not same:
        print(
            "\nwarning: the re-chunked passages differ from the stored ones; the ceiling is not comparable",
            file=sys.stderr,
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"\nfigures written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
