"""A distilled passage tower (`sqa train passage-tower`) against the packaged MiniLM, interleaved.

    .venv/bin/python bench/bench_distilled.py --data ../shared/data/realtimeqa --tower ENCODER_VERSION_FOLDER \
        [--since 2023-01-01 --until 2023-03-31] [--rounds 6] [--passages 600] [--backend onnx-int8] [--json OUT]

Both passage towers run on `--backend` (ONNX int8 by default, as an ingest runs them) through
`bench_encoder.onnx_ceiling` (torch: `torch_ceiling`): the tower's batches, tokenised before the
clock starts. Each round draws `--passages` passages of the window at random and times both towers
on them, the order alternating from round to round, so that a noisy machine's slow minute falls on
both. Then every passage of the window is encoded by both, and it prints the cosine of the
student's vectors to MiniLM's and dense recall@1/5/20 of the window's questions, asked by MiniLM
(the version's question tower) with the date filter: what the student changes in the dense search.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_encoder import (  # noqa: E402
    data_missing,
    onnx_ceiling,
    passages_of,
    recall,
    torch_ceiling,
    window_arguments,
)
from models.encoders import DualEncoder, load_encoder  # noqa: E402
from models.onnx_encoder import CPU_BATCH  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    window_arguments(ap)
    ap.set_defaults(since=dt.date(2023, 1, 1), until=dt.date(2023, 3, 31))  # the tuning quarter
    ap.add_argument("--tower", type=Path, required=True, help="a distilled encoder version's folder")
    ap.add_argument("--backend", default="onnx-int8", choices=("torch", "onnx", "onnx-int8"))
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--passages", type=int, default=600, help="passages per timed round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if data_missing(args.data):
        return 2
    if not (args.tower / "encoder.json").is_file():
        print(f"{args.tower} is not an encoder version folder (no encoder.json)", file=sys.stderr)
        return 2

    texts, bodies, days, questions = passages_of(args.data, args.since, args.until, 0)
    questions = [q for q in questions if q.answers]
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{len(texts)} passages of {args.since}..{args.until}, {len(questions)} questions; load {load}", flush=True)
    version = DualEncoder(args.tower, backend=args.backend)
    towers = {"minilm": load_encoder("minilm", backend=args.backend), "distilled": version.passage}
    ceiling = torch_ceiling if args.backend == "torch" else onnx_ceiling
    rng = np.random.default_rng(0)
    rates: dict[str, list[float]] = {name: [] for name in towers}
    for r in range(args.rounds):
        sample = [texts[i] for i in rng.choice(len(texts), size=min(args.passages, len(texts)), replace=False)]
        for name in sorted(towers, reverse=r % 2 == 1):
            rates[name].append(ceiling(towers[name], sample, CPU_BATCH))
        print(f"round {r + 1}: " + "  ".join(f"{n} {rates[n][-1]:.1f}" for n in towers) + " passages/s", flush=True)
    ratios = [d / m for d, m in zip(rates["distilled"], rates["minilm"])]
    vectors = {name: tower.encode_passages(texts) for name, tower in towers.items()}
    cos = (vectors["distilled"] * vectors["minilm"]).sum(axis=1)
    rows = {
        name: {
            "passages_per_s": round(float(np.median(rates[name])), 1),
            **recall(vectors[name], days, bodies, questions, version),  # MiniLM asks in both
        }
        for name in towers
    }
    summary = {
        "passages": len(texts),
        "questions": len(questions),
        "rows": rows,
        "speedup_median": round(float(np.median(ratios)), 3),
        "faster_rounds": sum(x > 1 for x in ratios),
        "rounds": len(ratios),
        "cos_mean": round(float(cos.mean()), 4),
        "cos_p1": round(float(np.percentile(cos, 1)), 4),
    }
    print(f"\n{'tower':10s} {'passages/s':>10s} {'R@1':>5s} {'R@5':>5s} {'R@20':>5s}")
    for name, row in rows.items():
        print(
            f"{name:10s} {row['passages_per_s']:10.1f} {row['recall@1']:5.1f} {row['recall@5']:5.1f} "
            f"{row['recall@20']:5.1f}"
        )
    print(
        f"distilled/minilm: {summary['speedup_median']:.2f}x (median of per-round ratios, faster in "
        f"{summary['faster_rounds']} of {summary['rounds']} rounds); cosine to MiniLM mean "
        f"{summary['cos_mean']:.4f}, 1st percentile {summary['cos_p1']:.4f}"
    )
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
