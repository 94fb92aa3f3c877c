"""Retrieval benchmark in the streaming setting: every question of a window is searched, as of its
own date, over everything the home's index holds up to that date (not only the articles found for
that question), by each retriever on the same questions.

    .venv/bin/python -m bench.bench_retrieval --home "$SQA_HOME" --from 2023-01-01 --to 2023-06-30 \
        --retrievers dense,bm25,hybrid-rrf,hybrid-weighted --out retrieval.json

Dense search uses the encoder the home's index was built with (SQA_ENCODER=auto): to measure a
DPR-tuned encoder, copy the home, switch the copy with `sqa index reencode --encoder VERSION`
(`sqa train retriever --until 2023-01-01` trains one on what is dated before the window), and run
this on the copy.

Per retriever: answer-string recall@1/5/20 (a gold answer, SQuAD-normalised, in the passage body
without its date prefix), the share of questions with a known gold article that find it in the top
20, the median days between the question date and the top-1 passage, and search latency p50/p95
(the retriever's own call, one thread, after a warm-up). Questions without a gold answer are left
out and counted. A retriever that needs BM25 files the index lacks says to run `sqa index bm25`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import select

from evaluation.bakeoff import latency_summary
from evaluation.metrics import answer_in_text
from settings import Settings
from store.tables import Question

KS = (1, 5, 20)  # --ks adds deeper cut-offs (e.g. 100, to see how much a re-ranker could gain)
RETRIEVERS = {
    "dense": ("dense", {}),
    "bm25": ("bm25", {}),
    "hybrid-rrf": ("hybrid", {"fusion": "rrf"}),
    "hybrid-weighted": ("hybrid", {"fusion": "weighted", "dense_weight": 0.5}),
}


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--home", default=os.environ.get("SQA_HOME", ".sqa"), help="SQA_HOME with the window ingested (read only)"
    )
    ap.add_argument("--from", dest="first", required=True, help="YYYY-MM-DD: first question date")
    ap.add_argument("--to", dest="last", required=True, help="YYYY-MM-DD: last question date")
    ap.add_argument(
        "--retrievers",
        default="dense,bm25,hybrid-rrf,hybrid-weighted",
        help=f"comma-separated, of {', '.join(RETRIEVERS)}",
    )
    ap.add_argument("--encoder", default="auto", help="SQA_ENCODER (default auto: the index's own encoder)")
    ap.add_argument("--ks", default="1,5,20", help="recall cut-offs, comma-separated (1, 5 and 20 always)")
    ap.add_argument("--max-questions", type=int, default=0, help="first N questions of the window (0: all)")
    ap.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    return ap.parse_args(argv)


def gold_urls(meta: dict) -> set[str]:
    return set((meta or {}).get("gold_urls", []))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import faiss  # noqa: PLC0415 (lazy: faiss)
    import torch  # noqa: PLC0415 (lazy: torch)

    from app.bootstrap.builders import build_encoder, index_state, open_database  # noqa: PLC0415 (lazy: app.bootstrap pulls faiss)
    from serving.retrieval import make_retriever  # noqa: PLC0415 (lazy: serving.retrieval imports faiss)

    unknown = [r for r in args.retrievers.split(",") if r not in RETRIEVERS]
    if unknown:
        print(f"error: unknown retriever(s) {unknown} (use {', '.join(RETRIEVERS)})", file=sys.stderr)
        return 2
    home = Path(args.home)
    if not (home / "sqa.db").exists() and "SQA_DATABASE_URL" not in os.environ:
        print(
            f"error: {home} holds no database: import and ingest the RealTimeQA slice first "
            "(../shared/data/realtimeqa; see README)",
            file=sys.stderr,
        )
        return 2
    faiss.omp_set_num_threads(1)
    torch.set_num_threads(1)
    settings = Settings(home=home, encoder=args.encoder)
    first, last = dt.date.fromisoformat(args.first), dt.date.fromisoformat(args.last)
    db = open_database(settings, migrate=False)
    encoder = build_encoder(settings)
    needs_bm25 = any(RETRIEVERS[r][0] != "dense" for r in args.retrievers.split(","))
    state = index_state(settings, db, encoder, lexical=needs_bm25)
    ks = tuple(sorted(set(KS) | {int(k) for k in args.ks.split(",") if k.strip()}))
    if not state.refresh():
        print(f"error: no index snapshot in {home}: run `sqa ingest` first", file=sys.stderr)
        return 2
    snap = state.current()
    with db.sessions() as session:
        rows = session.scalars(
            select(Question).where(Question.asked.between(first, last)).order_by(Question.asked, Question.qid)
        ).all()
        questions = [q for q in rows if q.answers and any(a.strip() for a in q.answers)]
        left_out = len(rows) - len(questions)
        if args.max_questions:
            questions = questions[: args.max_questions]
        results = {}
        for label in args.retrievers.split(","):
            kind, options = RETRIEVERS[label]
            retriever = make_retriever(kind, encoder, **options)
            try:
                retriever.retrieve(session, snap, questions[0].text, questions[0].asked, max(ks))  # warm-up
            except Exception as exc:  # e.g. no BM25 files
                print(f"{label}: skipped: {exc}", file=sys.stderr)
                continue
            hits = {k: 0 for k in ks}
            gold_known = gold_found = 0
            days, ms = [], []
            for q in questions:
                t0 = time.perf_counter()
                found = retriever.retrieve(session, snap, q.text, q.asked, max(ks))
                ms.append((time.perf_counter() - t0) * 1000)
                assert all(p.published <= q.asked for p in found), f"{label} returned a passage after {q.asked}"
                has = [answer_in_text(q.answers, p.text) for p in found]
                for k in ks:
                    hits[k] += any(has[:k])
                gold = gold_urls(q.meta)
                if gold:
                    gold_known += 1
                    gold_found += any(p.url in gold for p in found[:20])
                if found:
                    days.append((q.asked - found[0].published).days)
            n = len(questions)
            results[label] = {
                **{f"recall@{k}": hits[k] / n for k in ks},
                "gold_article@20": gold_found / gold_known if gold_known else None,
                "gold_known": gold_known,
                "median_days_top1": statistics.median(days) if days else None,
                "latency": latency_summary(ms),
            }
            r = results[label]
            gold_share = "-" if r["gold_article@20"] is None else f"{100 * r['gold_article@20']:5.1f}"
            print(
                f"{label:16s} recall@1 {100 * r['recall@1']:5.1f}  @5 {100 * r['recall@5']:5.1f}  "
                f"@20 {100 * r['recall@20']:5.1f}  "
                + "".join(f"@{k} {100 * r[f'recall@{k}']:5.1f}  " for k in ks if k > 20)
                + f"gold article@20 {gold_share} "
                f"(of {gold_known})  median days to top-1 {r['median_days_top1']}  "
                f"p50 {r['latency']['p50_ms']} ms  p95 {r['latency']['p95_ms']} ms",
                flush=True,
            )
    db.close()
    print(
        f"{len(questions)} questions {first}..{last} ({left_out} without a gold answer left out); index "
        f"{snap.snapshot_id} (encoder {snap.manifest.encoder}): {snap.index.ntotal} passages, "
        f"{snap.manifest.shards[0].key}..{snap.manifest.shards[-1].key}"
    )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "questions": len(questions),
                    "left_out": left_out,
                    "snapshot": snap.snapshot_id,
                    "encoder": snap.manifest.encoder,
                    "results": results,
                },
                indent=2,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
