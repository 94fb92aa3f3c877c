"""Encoder throughput and retrieval quality per backend: torch float, ONNX float, ONNX int8.

    .venv/bin/python bench/bench_encoder.py --data ../shared/data/realtimeqa \
        [--since 2023-04-01 --until 2023-06-30] [--max-passages 0] [--backends torch,onnx,onnx-int8] [--json OUT]

On the same passages, in one run: the RealTimeQA articles published in [since, until], cut into
passages by the ingest's own chunker (`indexer.chunking.chunk_texts`), encoded by the packaged
MiniLM on each backend (`SQA_ENCODER_BACKEND`) the way an ingest calls it (`encode_passages`,
batches of the encoder's own size: 8 on a CPU; `--batch-size` to set one). For each backend it prints:

- passages/s end to end (tokenising, batching by length, the model, pooling);
- the ceiling: the same model on batches tokenised beforehand (only the forward passes timed),
  so that the difference is what tokenising and batching cost;
- dense retrieval quality on the window's questions: each question, dated as the service dates it,
  searched exactly (inner product) over the passages published on or before its date;
  recall@1/5/20 = a gold answer string in the top k. The target is recall@20 within 0.5 points of
  torch float.
- the mean and minimum cosine between each passage's vector and torch's.

Threads: torch's default (one per core) and ONNX Runtime's pool sized to the cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from evaluation.metrics import answer_in_text  # noqa: E402
from indexer.chunking import chunk_texts, dated_text  # noqa: E402
from indexer.importers import read_realtimeqa  # noqa: E402
from models.encoders import load_encoder, query_text  # noqa: E402
from models.onnx_encoder import CPU_BATCH  # noqa: E402

DEFAULT_DATA = ROOT.parent / "shared" / "data" / "realtimeqa"


def passages_of(data: Path, since: dt.date, until: dt.date, limit: int):
    articles, questions, _ = read_realtimeqa(data, since=since, until=until)
    articles = sorted(articles, key=lambda a: (a.published, a.url))
    chunks = chunk_texts([a.text for a in articles])
    bodies, days = [], []
    for a, ps in zip(articles, chunks):
        bodies += ps
        days += [a.published] * len(ps)
    if limit:
        bodies, days = bodies[:limit], days[:limit]
    texts = [dated_text(body, day) for body, day in zip(bodies, days)]  # what an ingest's encoder reads
    return texts, bodies, np.array([d.toordinal() for d in days]), questions


def window_arguments(ap: argparse.ArgumentParser) -> None:
    """--data, --since and --until: the RealTimeQA window whose passages an encoder bench reads."""
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--since", type=dt.date.fromisoformat, default=dt.date(2023, 4, 1))
    ap.add_argument("--until", type=dt.date.fromisoformat, default=dt.date(2023, 6, 30))


def data_missing(data: Path) -> bool:
    """True, having said so on stderr, when the RealTimeQA slice is not at `data`."""
    if data.is_dir():
        return False
    print(f"the RealTimeQA slice is missing at {data} (pass --data)", file=sys.stderr)
    return True


def torch_ceiling(encoder, texts: list[str], batch_size: int) -> float:
    """passages/s of the torch model's forward passes alone, on batches tokenised beforehand."""
    import torch  # noqa: PLC0415 (lazy: torch)

    model = encoder.model
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    batches = [model.tokenize([texts[i] for i in order[s : s + batch_size]]) for s in range(0, len(order), batch_size)]
    with torch.inference_mode():
        model(batches[0])  # warm-up
        t0 = time.perf_counter()
        for b in batches:
            model(b)
    return len(texts) / (time.perf_counter() - t0)


def onnx_ceiling(tower, texts: list[str], batch_size: int) -> float:
    """passages/s of the ONNX session's runs alone, on feeds built beforehand, spread over the
    tower's threads as its own encoding spreads them."""
    feeds = [feed for _, feed in tower.feeds(texts, batch_size=batch_size)]
    tower.session.run(["hidden"], feeds[0])
    t0 = time.perf_counter()
    list(tower.pool().map(lambda f: tower.session.run(["hidden"], f), feeds))  # as the tower runs them
    return len(texts) / (time.perf_counter() - t0)


def recall(vectors: np.ndarray, days: np.ndarray, bodies: list[str], questions, encoder, ks=(1, 5, 20)) -> dict:
    qv = encoder.encode_queries([query_text(encoder, q.text, q.asked) for q in questions])
    hits = {k: 0 for k in ks}
    for q, v in zip(questions, qv):
        allowed = np.flatnonzero(days <= q.asked.toordinal())
        if allowed.size == 0:
            continue
        scores = vectors[allowed] @ v
        top = allowed[np.argsort(-scores, kind="stable")[: max(ks)]]
        found = [answer_in_text(q.answers, bodies[i]) for i in top]
        for k in ks:
            hits[k] += any(found[:k])
    return {f"recall@{k}": round(100 * hits[k] / max(len(questions), 1), 1) for k in ks}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    window_arguments(ap)
    ap.add_argument("--max-passages", type=int, default=0, help="0: every passage of the window")
    ap.add_argument("--backends", default="torch,onnx,onnx-int8")
    ap.add_argument("--batch-size", type=int, default=0, help="0: the encoder's own choice (8 on a CPU)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if data_missing(args.data):
        return 2

    texts, bodies, days, questions = passages_of(args.data, args.since, args.until, args.max_passages)
    questions = [q for q in questions if q.answers]
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"{len(texts)} passages of {args.since}..{args.until}, {len(questions)} questions; "
        f"{os.cpu_count()} cores, load {load}",
        flush=True,
    )
    rows, reference = [], None
    for backend in args.backends.split(","):
        encoder = load_encoder("minilm", backend=backend)
        encoder.encode_passages(texts[:64], batch_size=args.batch_size)  # warm-up
        t0 = time.perf_counter()
        vectors = encoder.encode_passages(texts, batch_size=args.batch_size)
        seconds = time.perf_counter() - t0
        batch = args.batch_size or CPU_BATCH
        ceiling = torch_ceiling(encoder, texts, batch) if backend == "torch" else onnx_ceiling(encoder, texts, batch)
        if reference is None:
            reference = vectors
        cos = (vectors * reference).sum(axis=1)
        row = {
            "backend": backend,
            "passages": len(texts),
            "seconds": round(seconds, 1),
            "passages_per_s": round(len(texts) / seconds, 1),
            "ceiling_per_s": round(ceiling, 1),
            "cos_mean": round(float(cos.mean()), 4),
            "cos_min": round(float(cos.min()), 4),
            **recall(vectors, days, bodies, questions, encoder),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    base = rows[0]
    print(
        f"\n{'backend':10s} {'passages/s':>10s} {'vs first':>8s} {'ceiling/s':>9s} {'of ceiling':>10s} "
        f"{'R@1':>5s} {'R@5':>5s} {'R@20':>5s} {'dR@20':>6s} {'cos mean/min':>13s}"
    )
    for r in rows:
        print(
            f"{r['backend']:10s} {r['passages_per_s']:10.1f} {r['passages_per_s'] / base['passages_per_s']:7.2f}x "
            f"{r['ceiling_per_s']:9.1f} {r['passages_per_s'] / r['ceiling_per_s']:9.0%} "
            f"{r['recall@1']:5.1f} {r['recall@5']:5.1f} {r['recall@20']:5.1f} "
            f"{r['recall@20'] - base['recall@20']:+6.1f} {r['cos_mean']:.4f}/{r['cos_min']:.4f}"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
