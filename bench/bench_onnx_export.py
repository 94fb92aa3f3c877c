"""The encoder's ONNX export, eager attention (the default) against SDPA's trace, interleaved.

    .venv/bin/python bench/bench_onnx_export.py --data ../shared/data/realtimeqa \
        [--since 2023-04-01 --until 2023-06-30] [--rounds 10] [--passages 400] [--json OUT]

Both exports of the packaged MiniLM are written to a temporary folder (`models.onnx_encoder.export_float`
with `attention="eager"` and `"sdpa"`, each quantised to int8 the way `export_onnx` does) and run as
the encoder runs them: the same tower's batches (8 passages, longest first), one thread per run,
two runs at once. Each round draws `--passages` passages of the window at random and times each
export on them, the order rotated from round to round, so that a noisy machine's slow minute falls on
both. It prints passages/s per round, the medians and the median of the per-round ratios, the
ops that differ between the graphs, and the cosine of the two exports' vectors to the float model's
(int8 noise, the same on both if the exports compute the same function).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_encoder import data_missing, passages_of, window_arguments  # noqa: E402
from models.encoders import PACKAGED_MINILM, packaged_minilm_path  # noqa: E402
from models.onnx_encoder import OnnxTower, export_float, quantize_int8  # noqa: E402

ATTENTIONS = ("eager", "sdpa")


def session(path: Path):
    import onnxruntime as ort  # noqa: PLC0415 (lazy: onnxruntime)

    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1  # as OnnxTower runs it
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def vectors(sess, batches, count: int) -> np.ndarray:
    out = np.zeros((count, 384), dtype=np.float32)
    for rows, feed in batches:
        hidden = sess.run(["hidden"], feed)[0]
        mask = feed["attention_mask"][..., None].astype(np.float32)
        out[rows] = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


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
    pool = ThreadPoolExecutor(2)
    with tempfile.TemporaryDirectory() as tmp:
        sessions, ops = {}, {}
        for attention in ATTENTIONS:
            float_file, int8_file = Path(tmp, f"{attention}.onnx"), Path(tmp, f"{attention}-int8.onnx")
            export_float(folder, float_file, attention=attention)
            quantize_int8(float_file, int8_file)
            import onnx  # noqa: PLC0415 (lazy: onnx)

            ops[attention] = collections.Counter(n.op_type for n in onnx.load(str(int8_file)).graph.node)
            sessions[attention] = session(int8_file)
        reference = session(Path(tmp, "eager.onnx"))
        rng = np.random.default_rng(0)
        rates: dict[str, list[float]] = {a: [] for a in ATTENTIONS}
        for r in range(args.rounds):
            chunk = [texts[i] for i in rng.choice(len(texts), args.passages, replace=False)]
            batches = tower.feeds(chunk)
            order = ATTENTIONS[r % 2 :] + ATTENTIONS[: r % 2]
            for attention in order:
                sess = sessions[attention]
                sess.run(["hidden"], batches[0][1])  # warm
                t0 = time.perf_counter()
                list(pool.map(lambda b, s=sess: s.run(["hidden"], b[1]), batches))
                rates[attention].append(len(chunk) / (time.perf_counter() - t0))
            line = "  ".join(f"{a} {rates[a][-1]:.1f}" for a in ATTENTIONS)
            print(f"round {r + 1}: {line} passages/s", flush=True)
        sample = tower.feeds(texts[: args.passages])
        ref = vectors(reference, sample, args.passages)
        cosine = {a: float((vectors(sessions[a], sample, args.passages) * ref).sum(axis=1).mean()) for a in ATTENTIONS}
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
