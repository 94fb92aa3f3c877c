"""Latency of date-filtered search over month shards vs one flat index holding everything.

    .venv/bin/python -m bench.bench_filtered_search [--n 200000] [--dim 384] [--months 24]   (from the repo root)

Random unit vectors spread uniformly over `months` monthly shards. For as_of days that admit
about 100%, 50%, 10% and 1% of the passages it times, per query:
  sharded     ShardedIndex.search (fan out over shards <= as_of, range selector in the boundary shard)
  flat+sel    one IndexIDMap2(IndexFlatIP) over everything with IDSelectorRange (the alternative design)
  flat        the same single index, unfiltered (the lower bound: no filtering at all)
for a batch of 1 query and a batch of 32. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime as dt
import time

import faiss
import numpy as np

from indexer.dates import day_number, from_day_number, month_end, month_key, next_month
from indexer.ids import id_day_numbers, ids_through, make_ids
from indexer.shards import MonthShard, ShardedIndex


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def build(n: int, dim: int, months: int, seed: int):
    """(sharded index, single flat IndexIDMap2, all ids (n,))."""
    rng = np.random.default_rng(seed)
    first = dt.date(2021, 1, 1)
    per_month = np.full(months, n // months)
    per_month[: n % months] += 1
    shards, all_x, all_ids, month, seq = [], [], [], first, 0
    for count in per_month:
        days = rng.integers(day_number(month), day_number(month_end(month)) + 1, size=count)
        ids = make_ids(days, np.arange(seq, seq + count))
        seq += count
        x = unit(rng, count, dim)  # (count, dim)
        shards.append(MonthShard.build(month_key(month), x, ids))
        all_x.append(x)
        all_ids.append(ids)
        month = next_month(month)
    flat = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    flat.add_with_ids(np.concatenate(all_x), np.concatenate(all_ids))
    return ShardedIndex(shards), flat, np.concatenate(all_ids)


def per_query_ms(fn, queries: np.ndarray, batch: int, repeats: int) -> float:
    """Median over `repeats` calls of fn(batch of queries), divided by the batch size."""
    fn(queries[:batch])  # warm-up
    times = []
    for r in range(repeats):
        start = (r * batch) % (len(queries) - batch)
        q = queries[start : start + batch]
        t0 = time.perf_counter()
        fn(q)
        times.append(time.perf_counter() - t0)
    return 1000 * float(np.median(times)) / batch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--months", type=int, default=24)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--threads", type=int, default=0, help="OpenMP threads for FAISS (0: its default)")
    args = ap.parse_args()
    if args.threads:
        faiss.omp_set_num_threads(args.threads)

    t0 = time.perf_counter()
    index, flat, ids = build(args.n, args.dim, args.months, seed=0)
    print(
        f"built {index.ntotal} vectors, dim {args.dim}, {len(index.shards)} shards "
        f"in {time.perf_counter() - t0:.1f}s; faiss {faiss.__version__}, {faiss.omp_get_max_threads()} threads"
    )
    queries = unit(np.random.default_rng(1), 4096, args.dim)
    days = np.sort(id_day_numbers(ids))

    print(f"\nms per query, k={args.k} (median of {args.repeats} calls)")
    print(
        f"{'as_of':>10} {'share':>6} {'shards':>6} | {'b1 sharded':>10} {'flat+sel':>9} {'flat':>7} "
        f"| {'b32 sharded':>11} {'flat+sel':>9} {'flat':>7}"
    )
    for share in (1.0, 0.5, 0.1, 0.01):
        as_of = from_day_number(int(days[min(len(days) - 1, int(share * len(days)))]))
        actual = float(np.mean(days <= day_number(as_of)))
        searched = sum(s.min_day <= as_of for s in index.shards)
        params = faiss.SearchParameters(sel=faiss.IDSelectorRange(0, ids_through(as_of)))
        row = []
        for batch in (1, 32):
            reps = args.repeats if batch == 1 else max(10, args.repeats // 8)
            row.append(per_query_ms(lambda q: index.search(q, as_of, args.k), queries, batch, reps))  # noqa: B023 (timed now)
            row.append(per_query_ms(lambda q: flat.search(q, args.k, params=params), queries, batch, reps))  # noqa: B023
            row.append(per_query_ms(lambda q: flat.search(q, args.k), queries, batch, reps))
        print(
            f"{as_of.isoformat():>10} {actual:>6.1%} {searched:>6} | {row[0]:>10.3f} {row[1]:>9.3f} {row[2]:>7.3f} "
            f"| {row[3]:>11.3f} {row[4]:>9.3f} {row[5]:>7.3f}"
        )


if __name__ == "__main__":
    main()
