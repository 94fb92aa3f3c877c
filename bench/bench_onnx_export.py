"""The encoder's ONNX export, eager attention (the default) against SDPA's trace, interleaved.

    .venv/bin/python bench/bench_onnx_export.py --data ../shared/data/realtimeqa \
        [--since 2023-04-01 --until 2023-06-30] [--rounds 10] [--passages 400] [--json OUT]

Both exports of the packaged MiniLM are written to a temporary folder
(`models.onnx_encoder.export_float` with `attention="eager"` and `"sdpa"`, each quantised to int8
the way `export_onnx` does) and run as the encoder runs them, through `bench_encoder.onnx_ceiling`:
the tower's batches (8 passages, longest first, tokenised before the clock starts), one thread per
run, as many runs at once as cores. Each round draws `--passages` passages of the window at random
and times each export on them, the order rotated from round to round, so that a noisy machine's slow
minute falls on both. It prints passages/s per round, the medians and the median of the per-round
ratios, the ops that differ between the graphs, and the cosine of the two exports' vectors to the
float model's (int8 noise, the same on both if the exports compute the same function).
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_encoder import data_missing, onnx_ceiling, passages_of, window_arguments  # noqa: E402
from models.encoders import PACKAGED_MINILM, packaged_minilm_path  # noqa: E402
from models.onnx_encoder import CPU_BATCH, OnnxTower, export_float, quantize_int8  # noqa: E402

ATTENTIONS = ("eager", "sdpa")


def tower_on(tower: OnnxTower, path: Path) -> OnnxTower:
    """`tower` (its tokenizer, batching, pooling and threads) running the ONNX file `path` instead."""
    import onnxruntime as ort  # noqa: PLC0415 (lazy: onnxruntime)

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # as OnnxTower runs it
    other = copy.copy(tower)
    other.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return other


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    window_arguments(ap)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--passages", type=int, default=400, help="passages per round")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if data_missing(args.data):
        return 2
    texts, *_ = passages_of(args.data, args.since, args.until, 0)
    if len(texts) < args.passages:
        print(f"only {len(texts)} passages in {args.since}..{args.until}", file=sys.stderr)
        return 2
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{len(texts)} passages of {args.since}..{args.until}; {os.cpu_count()} cores, load {load}", flush=True)
    folder = packaged_minilm_path()
    tower = OnnxTower(folder, name=PACKAGED_MINILM, quantize=True)  # its tokenizer and batching
    with tempfile.TemporaryDirectory() as tmp:
        towers, ops = {}, {}
        for attention in ATTENTIONS:
            float_file, int8_file = Path(tmp, f"{attention}.onnx"), Path(tmp, f"{attention}-int8.onnx")
            export_float(folder, float_file, attention=attention)
            quantize_int8(float_file, int8_file)
            ops[attention] = collections.Counter(n.op_type for n in onnx.load(str(int8_file)).graph.node)
            towers[attention] = tower_on(tower, int8_file)
        reference = tower_on(tower, Path(tmp, "eager.onnx"))
        rng = np.random.default_rng(0)
        rates: dict[str, list[float]] = {a: [] for a in ATTENTIONS}
        for r in range(args.rounds):
            chunk = [texts[i] for i in rng.choice(len(texts), args.passages, replace=False)]
            for attention in ATTENTIONS[r % 2 :] + ATTENTIONS[: r % 2]:
                rates[attention].append(onnx_ceiling(towers[attention], chunk, CPU_BATCH))
            line = "  ".join(f"{a} {rates[a][-1]:.1f}" for a in ATTENTIONS)
            print(f"round {r + 1}: {line} passages/s", flush=True)
        sample = texts[: args.passages]
        ref = reference.encode(sample)
        cosine = {a: float((towers[a].encode(sample) * ref).sum(axis=1).mean()) for a in ATTENTIONS}
    ratio = np.array(rates["eager"]) / np.array(rates["sdpa"])
    diff = {op: (ops["eager"][op], ops["sdpa"][op]) for op in set(ops["eager"]) | set(ops["sdpa"])}
    diff = {op: n for op, n in sorted(diff.items()) if n[0] != n[1]}
    summary = {
        "passages_per_s": {a: round(float(np.median(rates[a])), 1) for a in ATTENTIONS},
        "eager_over_sdpa_median": round(float(np.median(ratio)), 3),
        "rounds_eager_faster": int((ratio > 1).sum()),
        "rounds": args.rounds,
        "ops_eager_vs_sdpa": diff,
        "cosine_to_float": {a: round(c, 4) for a, c in cosine.items()},
    }
    rate = summary["passages_per_s"]
    print(
        f"\nmedian passages/s: eager {rate['eager']}, sdpa {rate['sdpa']}; eager/sdpa "
        f"{summary['eager_over_sdpa_median']}x (faster in {summary['rounds_eager_faster']} of {args.rounds} rounds)"
    )
    print(f"ops that differ (eager, sdpa): {diff}")
    print(f"mean cosine to the float vectors: {summary['cosine_to_float']}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
