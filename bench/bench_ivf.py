"""IVF shards at scale: date-filtered vs unfiltered latency, recall@10 against exact search, memory
per passage, and the time to add a month against the size of the index.

    .venv/bin/python -m bench.bench_ivf --n 1000000                        # 24 monthly IVF-Flat shards
    .venv/bin/python -m bench.bench_ivf --n 1000000 --layout single        # one shard over all 24 months
    .venv/bin/python -m bench.bench_ivf --n 10000000 --kind ivf-sq8        # 4.1 GiB, ~25 min on one core

Vectors are synthetic (384 dims, unit norm): a point on a 16-dimensional latent sphere plus
isotropic noise (cosine ~0.8 to the nearest neighbour). On that data IVF's recall@10 at a given
share of probed lists is close to what it is on real MiniLM passages (measured on 9,591
RealTimeQA passages: 3% of lists -> 0.93, 6% -> 0.97), where uniformly random vectors would make
every IVF look useless. They are generated month by month from seeded generators, so nothing of
size n is ever held at once except the index itself (--layout single holds all vectors to build).

Per month (--layout months) the shard is built with MonthShard.build and written with
write_shard (the incremental cost of a new month); the exact top-10 for every filter is
accumulated month by month by brute force (faiss.knn). Then, with one FAISS thread, each query is
timed alone (batch 1) for every filter in turn (round robin, so load changes hit all alike), and
p50 latencies are compared with unfiltered search over the whole index. Prints tables; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import faiss
import numpy as np

from indexer.dates import day_number, from_day_number, month_end, month_key, next_month
from indexer.ids import ids_through, make_ids
from indexer.ivf import FLAT, filtered_nprobe, ivf_spec
from indexer.manifest import Manifest, write_manifest
from indexer.shards import MonthShard, ShardedIndex
from indexer.snapshot import ShardCache, write_shard

SHARES = (1.0, 0.1, 0.01)
LATENT, NOISE = 16, 0.3
BYTES_PER_VECTOR = {"flat": 1600, "ivf-flat": 1550, "ivf-sq8": 400, "ivf-pq": 64}  # + ids and structures


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class Generator:
    """Seeded latent-factor vectors: part `i` is always the same, whatever else was generated."""

    def __init__(self, dim: int, seed: int):
        rng = np.random.default_rng(seed)
        self.basis = np.linalg.qr(rng.standard_normal((dim, LATENT)))[0].T.astype(np.float32)  # (16, dim)
        self.dim, self.seed = dim, seed

    def part(self, i: int, n: int) -> np.ndarray:
        """(n, dim) float32 unit vectors."""
        rng = np.random.default_rng((self.seed, i))
        z = unit(rng.standard_normal((n, LATENT), dtype=np.float32)) @ self.basis
        return np.ascontiguousarray(unit(z + NOISE * unit(rng.standard_normal((n, self.dim), dtype=np.float32))))


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def loaded_rss(index_dir: Path, manifest: Manifest) -> int:
    """RSS a fresh process gains by loading the snapshot (its own baseline taken after the imports)."""
    code = (
        "import sys; from pathlib import Path; from bench.bench_ivf import rss_bytes; "
        "from indexer.manifest import read_manifest; from indexer.snapshot import ShardCache; "
        "d = Path(sys.argv[1]); "
        "m = read_manifest(d / 'snapshots' / sys.argv[2]); r0 = rss_bytes(); "
        "i = ShardCache().open_snapshot(d, m, expected_encoder=None, expected_dim=None); "
        "print(rss_bytes() - r0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(index_dir), manifest.file_name],
        check=True,
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    return int(out.stdout.split()[-1])


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def layout(n: int, months: int, seed: int) -> list[tuple[str, np.ndarray]]:
    """[(month key, (count,) int64 ids)] with days uniform inside each month, starting 2021-01."""
    rng = np.random.default_rng(seed)
    per = np.full(months, n // months)
    per[: n % months] += 1
    out, month, seq = [], dt.date(2021, 1, 1), 0
    for count in per:
        days = np.sort(rng.integers(day_number(month), day_number(month_end(month)) + 1, size=count))
        out.append((month_key(month), make_ids(days, np.arange(seq, seq + count))))
        seq += count
        month = next_month(month)
    return out


def as_of_days(parts, shares) -> list[dt.date]:
    """The day through which about `share` of all passages were published, for each share."""
    days = np.concatenate([ids >> 40 for _, ids in parts])  # already sorted: months in order, days sorted
    return [from_day_number(int(days[min(len(days) - 1, int(s * len(days)) - 1)])) for s in shares]


def build(args, gen, parts, queries, filters, tmp: Path) -> tuple[Manifest, list, list, dict]:
    """Write the shards under `tmp`; returns their manifest, per-month build rows, ground-truth heaps
    per filter, and sizes."""
    heaps = [faiss.ResultHeap(len(queries), args.k, keep_max=True) for _ in filters]
    rows, file_bytes, exact_s, before = [], 0, 0.0, 0
    manifest = Manifest.new("synthetic", args.dim)
    if args.layout == "single":
        xs = [gen.part(i, len(ids)) for i, (_, ids) in enumerate(parts)]
        groups = [("history-2023-01", np.concatenate(xs), np.concatenate([ids for _, ids in parts]))]
        del xs
    else:
        groups = ((key, None, ids) for key, ids in parts)
    faiss.omp_set_num_threads(args.build_threads)
    for i, (key, x, ids) in enumerate(groups):
        x = gen.part(i, len(ids)) if x is None else x  # (count, dim)
        t0 = time.perf_counter()
        for heap, as_of in zip(heaps, filters):  # exact top-k among ids <= as_of
            keep = len(ids) if as_of is None else int(np.searchsorted(ids, ids_through(as_of)))
            if keep:
                dist, pos = faiss.knn(queries, x[:keep], min(args.k, keep), faiss.METRIC_INNER_PRODUCT)
                heap.add_result(dist, np.where(pos >= 0, ids[np.maximum(pos, 0)], -1))
        exact_s += time.perf_counter() - t0
        spec = FLAT if args.kind == "flat" else ivf_spec(args.kind, len(ids), args.dim, nprobe=args.nprobe)
        t0 = time.perf_counter()
        shard = MonthShard.build(key, x, ids, spec=spec)
        t1 = time.perf_counter()
        entry = write_shard(tmp, shard)
        manifest = manifest.with_shard(entry)
        write_manifest(tmp, manifest)
        t2 = time.perf_counter()
        file_bytes += (tmp / entry.file).stat().st_size
        rows.append((key, before, len(ids), t1 - t0, t2 - t1, shard.spec))
        print(
            f"  {key}: {len(ids):>9,} vectors onto {before:>11,}: build {t1 - t0:6.1f}s  write {t2 - t1:5.2f}s  "
            f"{shard.spec.kind} nlist={shard.spec.nlist} nprobe={shard.spec.nprobe}",
            flush=True,
        )
        before += len(ids)
        del x, shard
    for heap in heaps:
        heap.finalize()
    return manifest, rows, heaps, {"file_bytes": file_bytes, "exact_s": exact_s}


def recall_at(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(t[t >= 0])) / max(1, (t >= 0).sum()) for f, t in zip(found, truth)]))


def boundary_nprobe(index: ShardedIndex, as_of: dt.date) -> str:
    """The nprobe the boundary shard uses for as_of (the shard holding as_of), as 'used/nlist'."""
    for s in index.shards:
        if s.min_day <= as_of < s.max_day and s.spec.is_ivf:
            share = s.count_through(as_of) / s.ntotal
            return f"{filtered_nprobe(s.spec.nprobe, s.spec.nlist, share)}/{s.spec.nlist} ({share:.0%})"
    return "-"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--months", type=int, default=24)
    ap.add_argument(
        "--layout",
        choices=["months", "single"],
        default="months",
        help="one shard per month, or one shard over all months (a merged history shard)",
    )
    ap.add_argument("--kind", choices=["flat", "ivf-flat", "ivf-sq8", "ivf-pq"], default="ivf-flat")
    ap.add_argument("--nprobe", type=int, default=0, help="lists an unfiltered query probes (0: nlist/16)")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=1, help="timing passes over the queries")
    ap.add_argument("--build-threads", type=int, default=1, help="FAISS threads while building (search: 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    need = args.n * BYTES_PER_VECTOR[args.kind] * (2 if args.layout == "single" else 1.1)
    avail = mem_available()
    print(
        f"faiss {faiss.__version__}; {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}; "
        f"{avail / 2**30:.1f} GiB available; the index needs ~{need / 2**30:.1f} GiB"
    )
    if need > 0.7 * avail:
        fit = int(0.7 * avail / (need / args.n)) // 1_000_000 * 1_000_000
        print(
            f"n={args.n:,} with {args.kind} does not fit in memory here; running the largest size that fits: "
            f"n={fit:,} (or use --kind ivf-pq / ivf-sq8)"
        )
        args.n = fit
        if fit == 0:
            return
    gen = Generator(args.dim, args.seed)
    queries = Generator(args.dim, args.seed).part(10**6, args.queries)  # same distribution, unseen points
    parts = layout(args.n, args.months, args.seed)
    filters = [None] + as_of_days(parts, SHARES)  # None: unfiltered
    print(
        f"n={args.n:,} dim={args.dim} {args.months} months, layout {args.layout}, kind {args.kind}, "
        f"{args.queries} queries, k={args.k}"
    )
    t0 = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="bench_ivf_"))
    try:
        manifest, rows, heaps, sizes = build(args, gen, parts, queries, filters, tmp)
        print(
            f"built in {time.perf_counter() - t0:.0f}s ({args.build_threads} FAISS thread(s)); exact ground "
            f"truth {sizes['exact_s']:.0f}s of it"
        )
        sizes["loaded"] = loaded_rss(tmp, manifest)
        # Search what a server holds: the snapshot loaded from its files (checksums and ids verified).
        index = ShardCache().open_snapshot(tmp, manifest, expected_encoder="synthetic", expected_dim=args.dim)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    faiss.omp_set_num_threads(1)
    calls = [(dt.date.max, "unfiltered")] + [(d, f"{s:.0%}") for d, s in zip(filters[1:], SHARES)]
    times = [[] for _ in calls]
    order = np.random.default_rng(args.seed)
    for c in range(len(calls)):  # warm-up
        index.search(queries[:1], calls[c][0], args.k)
    for _ in range(args.repeats):
        for q in range(len(queries)):
            for c in order.permutation(len(calls)):  # a fresh order per query: no call always goes first
                as_of = calls[c][0]
                t = time.perf_counter()
                index.search(queries[q : q + 1], as_of, args.k)
                times[c].append(time.perf_counter() - t)
    base = float(np.median(times[0]))
    print(f"\nlatency, batch 1, 1 thread (p50 over {len(times[0])} searches); recall@{args.k} against exact search")
    print(
        f"{'filter':>10} {'as_of':>10} {'shards':>6} {'boundary nprobe':>20} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'x unfilt':>8} {'recall':>7}"
    )
    for c, ((as_of, label), heap) in enumerate(zip(calls, heaps)):
        _, found = index.search(queries, as_of, args.k)
        searched = sum(s.min_day <= as_of for s in index.shards)
        p50, p95 = 1000 * np.median(times[c]), 1000 * np.percentile(times[c], 95)
        day = "-" if as_of == dt.date.max else as_of.isoformat()
        print(
            f"{label:>10} {day:>10} {searched:>6} {boundary_nprobe(index, as_of):>20} {p50:>8.3f} {p95:>8.3f} "
            f"{p50 / 1000 / base:>8.2f} {recall_at(found, heap.I):>7.3f}"
        )

    n = index.ntotal
    print(
        f"\nmemory per passage: {sizes['file_bytes'] / n:,.0f} bytes in shard files, {sizes['loaded'] / n:,.0f} "
        f"bytes of RSS a fresh process gains loading them (peak RSS of this run "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.1f} GiB)"
    )
    if args.layout == "months" and len(rows) >= 4:
        q = max(1, len(rows) // 4)
        per = [r[3] + r[4] for r in rows]
        print(
            f"add a month (build + write shard and manifest): first {q} months {np.mean(per[:q]):.1f}s each "
            f"(index {rows[0][1]:,}..{rows[q - 1][1]:,} vectors), last {q} months {np.mean(per[-q:]):.1f}s each "
            f"(index {rows[-q][1]:,}..{rows[-1][1]:,}); ratio last/first {np.mean(per[-q:]) / np.mean(per[:q]):.2f}"
        )
    print(f"load average now {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
