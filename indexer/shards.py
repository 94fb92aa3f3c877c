"""Month shards of passage vectors and the date-filtered search that fans out over them.

A `MonthShard` owns one inner-product index with its ids (ids from `indexer.ids`, so the
publication day is in the id): exact flat by default, or an IVF index for large shards (its
`ShardSpec`, from `indexer.ivf`, which also documents how IVF shards keep recall under a date
filter). A `ShardedIndex` is the immutable set of shards of one
snapshot: a query searches every shard that starts on or before `as_of`, restricts only the
boundary shard (the one holding `as_of` itself) with an id range, and merges the per-shard
top-k with `faiss.ResultHeap`, as faiss `contrib/exhaustive_search.py` does.

Example:
    >>> shard = MonthShard.build("2023-04", vectors, ids)    # (n, d) float32, (n,) int64
    >>> index = ShardedIndex([history, shard])
    >>> scores, ids = index.search(queries, dt.date(2023, 4, 14), 10)   # (nq, 10), (nq, 10)
    >>> big = MonthShard.build("2023-05", vectors, ids, spec=ivf_spec("ivf-flat", len(ids), 384))
"""

from __future__ import annotations

import datetime as dt
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import cast

import faiss
import numpy as np

from indexer.dates import day_number, from_day_number, month_end, parse_month
from indexer.ids import id_day, id_day_numbers, ids_from, ids_through
from indexer.index_errors import REBUILD_HINT, IndexIntegrityError
from indexer.ivf import FLAT, ShardSpec, build_ivf, ivf_list_ids, ivf_search_params, spec_of

# A key is also the start of the shard's file name: "2023-04", "history-2023-01".
_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")
_MONTH_KEY_RE = re.compile(r"^\d{4}-\d{2}$")
_HISTORY_KEY_RE = re.compile(r"^history-(\d{4}-\d{2})$")
# A live piece: articles of a month published while it is open, in arrival order ("live-2023-04-000017").
LIVE_PREFIX = "live-"
_LIVE_KEY_RE = re.compile(r"^live-(\d{4}-\d{2})-(\d{6})$")


def check_key(key: str) -> str:
    """Refuse shard keys that could not be a file name prefix."""
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise ValueError(f"shard key {key!r} must be letters, digits, '-' or '_' (e.g. '2023-04')")
    return key


def live_key(month: str, seq: int) -> str:
    """The key of live piece `seq` of `month` ('2023-04', 17 -> 'live-2023-04-000017')."""
    if not _MONTH_KEY_RE.match(month) or not 0 <= seq < 1_000_000:
        raise ValueError(
            f"a live piece needs a YYYY-MM month and a sequence number below 1,000,000, not {month!r} and {seq!r}"
        )
    return f"{LIVE_PREFIX}{month}-{seq:06d}"


def is_live_key(key: str) -> bool:
    """Whether `key` names a live piece (which may overlap other shards' days: its ids never do)."""
    return bool(_LIVE_KEY_RE.match(key))


def live_key_parts(key: str) -> tuple[str, int]:
    """'live-2023-04-000017' -> ('2023-04', 17)."""
    m = _LIVE_KEY_RE.match(key)
    if m is None:
        raise ValueError(f"shard key {key!r} is not a live piece's (live-YYYY-MM-NNNNNN)")
    return m.group(1), int(m.group(2))


def overlap_allowed(a: str, b: str) -> bool:
    """Two shards may share days only when one is a live piece: month and history shards partition
    the days, live pieces hold late and current articles beside them (every passage has one id)."""
    return is_live_key(a) or is_live_key(b)


def key_span(key: str) -> tuple[dt.date | None, dt.date]:
    """Days a shard key allows: '2023-04' and 'live-2023-04-000017' -> (Apr 1, Apr 30);
    'history-2023-01' -> (None, Dec 31, 2022).

    Other keys (merged shards named otherwise) allow any day: (None, date.max).
    """
    live = _LIVE_KEY_RE.match(key)
    if _MONTH_KEY_RE.match(key) or live:
        first = parse_month(live.group(1) if live else key)
        return first, month_end(first)
    m = _HISTORY_KEY_RE.match(key)
    if m:
        return None, parse_month(m.group(1)) - dt.timedelta(days=1)
    return None, dt.date.max


def check_as_of(as_of: dt.date) -> dt.date:
    # datetime is a subclass of date, and comparing one with a date raises: refuse it up front.
    if isinstance(as_of, dt.datetime) or not isinstance(as_of, dt.date):
        raise TypeError(f"as_of must be a datetime.date, got {type(as_of).__name__} {as_of!r}")
    return as_of


def check_k(k: int) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return int(k)


def as_queries(queries: np.ndarray, dim: int) -> np.ndarray:
    """Validate (nq, dim) queries; returns them C-contiguous float32."""
    q = np.asarray(queries)
    if q.ndim != 2 or q.shape[1] != dim:
        raise ValueError(f"queries must have shape (nq, {dim}), got {q.shape}")
    if not np.issubdtype(q.dtype, np.floating):
        raise ValueError(f"queries must be floating point, got dtype {q.dtype}")
    return np.ascontiguousarray(q, dtype=np.float32)


def empty_results(nq: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(nq, k) scores of -inf and ids of -1: what a search finds where nothing qualifies."""
    return np.full((nq, k), -np.inf, dtype=np.float32), np.full((nq, k), -1, dtype=np.int64)


class MonthShard:
    """One inner-product index over the passages of a span of days (normally a month).

    Build with `MonthShard.build` or `MonthShard.load`; the instance is never mutated after that,
    so any number of threads may search it at once. `spec` says whether the index is exact (flat:
    an IndexIDMap2 over an IndexFlatIP) or an IVF index holding the ids itself, its lists sorted by id.
    """

    def __init__(
        self,
        key: str,
        index: faiss.Index,
        min_day: dt.date,
        max_day: dt.date,
        *,
        spec: ShardSpec = FLAT,
        ids: np.ndarray | None = None,
    ):
        self.key = check_key(key)
        self.min_day = min_day
        self.max_day = max_day
        self.dim = int(index.d)
        self.spec = spec
        self._index = index
        # Passages per day, for the share of the shard a date filter keeps: (u,) day numbers, (u,) cumulative counts.
        days, counts = np.unique(id_day_numbers(self.ids() if ids is None else ids), return_counts=True)
        self._days, self._cum = days, np.cumsum(counts)

    def __repr__(self) -> str:
        return (
            f"MonthShard({self.key!r}, {self.ntotal} vectors, {self.min_day}..{self.max_day}, dim={self.dim}, "
            f"{self.spec.kind})"
        )

    @classmethod
    def build(cls, key: str, vectors: np.ndarray, ids: np.ndarray, *, spec: ShardSpec = FLAT) -> MonthShard:
        """Index `vectors` (n, dim) float32 under `ids` (n,) int64; the day span comes from the ids.

        `spec` picks the index type (`indexer.ivf.ShardPolicy.spec_for` chooses it by size).
        """
        check_key(key)
        if not isinstance(vectors, np.ndarray) or vectors.dtype != np.float32 or vectors.ndim != 2:
            raise ValueError(f"shard {key}: vectors must be a 2-d float32 array, got {_describe(vectors)}")
        if not isinstance(ids, np.ndarray) or ids.dtype != np.int64 or ids.ndim != 1:
            raise ValueError(f"shard {key}: ids must be a 1-d int64 array, got {_describe(ids)}")
        n, dim = vectors.shape
        if n == 0 or dim == 0:
            raise ValueError(f"shard {key}: no vectors to index (shape {vectors.shape}); a shard is never empty")
        if ids.shape[0] != n:
            raise ValueError(f"shard {key}: {n} vectors but {ids.shape[0]} ids")
        if not np.isfinite(vectors).all():
            raise ValueError(f"shard {key}: vectors contain NaN or infinity")
        if ids.min() < 0:
            raise ValueError(f"shard {key}: negative id {int(ids.min())}")
        uniq, counts = np.unique(ids, return_counts=True)
        if uniq.size != n:
            dup = int(uniq[counts > 1][0])
            raise ValueError(f"shard {key}: duplicate id {dup} ({id_day(dup)}), each passage must be indexed once")
        days = id_day_numbers(ids)
        min_day, max_day = from_day_number(days.min()), from_day_number(days.max())
        lo, hi = key_span(key)
        if (lo is not None and min_day < lo) or max_day > hi:
            raise ValueError(
                f"shard {key}: passages published {min_day}..{max_day} do not belong in it "
                f"(it holds {lo or 'anything'}..{hi})"
            )
        index: faiss.Index
        if spec.is_ivf:
            order = np.argsort(ids, kind="stable")  # id order: every inverted list sorted by day
            ids = np.ascontiguousarray(ids[order])
            index = build_ivf(vectors[order], ids, spec)
        else:
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))  # keeps a reference to the flat index
            index.add_with_ids(np.ascontiguousarray(vectors), np.ascontiguousarray(ids))
        return cls(key, index, min_day, max_day, spec=spec, ids=ids)

    @property
    def ntotal(self) -> int:
        return int(self._index.ntotal)

    def ids(self) -> np.ndarray:
        """(ntotal,) int64 ids (a copy): insertion order for flat shards, list by list for IVF ones."""
        if self.spec.is_ivf:
            return ivf_list_ids(cast(faiss.IndexIVF, self._index))[0]
        return faiss.vector_to_array(cast(faiss.IndexIDMap2, self._index).id_map).astype(np.int64, copy=False)

    def vectors(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids (n,) int64, vectors (n, dim) float32) of every passage, row i the vector of ids[i]:
        what a live piece is merged, compacted or pruned from without encoding anything again.
        Exact for flat shards and IVF-flat; IVF with a codec gives its decoded (approximate) vectors."""
        if not self.spec.is_ivf:
            flat = faiss.downcast_index(cast(faiss.IndexIDMap2, self._index).index)
            return self.ids(), flat.reconstruct_n(0, self.ntotal)
        index = faiss.deserialize_index(self.to_bytes())  # a private copy: make_direct_map changes it
        ivf = faiss.extract_index_ivf(index)
        ivf.make_direct_map()
        ids = ivf_list_ids(cast(faiss.IndexIVF, index))[0]  # the IVF index itself: shards never wrap one
        return ids, np.vstack([ivf.reconstruct(int(i)) for i in ids]) if ids.size else np.zeros(
            (0, self.dim), np.float32
        )

    def count_through(self, as_of: dt.date) -> int:
        """Passages of this shard published on or before `as_of`."""
        i = int(np.searchsorted(self._days, day_number(as_of), side="right"))
        return int(self._cum[i - 1]) if i else 0

    def search(self, queries: np.ndarray, k: int, as_of: dt.date | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product among passages published on or before `as_of` (all if None).

        Args:
            queries: (nq, dim) float32.
            k: results per query; missing results are id -1 with score -inf.
        Returns:
            scores (nq, k) float32 best first, ids (nq, k) int64.
        """
        q = as_queries(queries, self.dim)
        return self._search(q, check_k(k), None if as_of is None else check_as_of(as_of))

    def _search(self, q: np.ndarray, k: int, as_of: dt.date | None) -> tuple[np.ndarray, np.ndarray]:
        if as_of is not None and as_of < self.min_day:
            return empty_results(q.shape[0], k)
        params: faiss.SearchParameters | None = None
        boundary = as_of if as_of is not None and as_of < self.max_day else None  # as_of, in the boundary shard only
        if self.spec.is_ivf:  # nprobe raised by 1/share in the boundary shard (indexer.ivf)
            share = self.count_through(boundary) / self.ntotal if boundary is not None else 1.0
            params = ivf_search_params(
                self.spec, share, ids_from(self.min_day), ids_through(boundary) if boundary is not None else None
            )
        elif boundary is not None:
            # Boundary shard: only ids of days <= as_of. Other shards are searched unfiltered
            # (a selector costs a per-id check and keeps FAISS off its BLAS path).
            selector = faiss.IDSelectorRange(ids_from(self.min_day), ids_through(boundary))
            # faiss's stubs declare SearchParameters.__init__(self) only; its wrapper takes fields as keywords
            params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
        scores, ids = self._index.search(q, k, params=params)
        scores[ids < 0] = -np.inf  # FAISS pads with -FLT_MAX
        return scores, ids

    def to_bytes(self) -> np.ndarray:
        """The FAISS serialisation, (nbytes,) uint8: what `save` writes."""
        return faiss.serialize_index(self._index)

    @classmethod
    def from_bytes(
        cls,
        data: bytes | np.ndarray,
        key: str,
        expected_count: int,
        dim: int,
        *,
        min_day: dt.date,
        max_day: dt.date,
        source: str = "<bytes>",
        spec: ShardSpec = FLAT,
    ) -> MonthShard:
        """Deserialise a shard and check it against what its manifest entry says (see `load`)."""
        where = f"shard {key} ({source})"
        try:
            index = faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexIntegrityError(f"{where} is not a readable FAISS index ({exc}); {REBUILD_HINT}") from None
        expected = "an inner-product IndexIDMap2" if not spec.is_ivf else f"an inner-product {spec}"
        try:
            found = spec_of(index, spec.nprobe) if spec.is_ivf and isinstance(index, faiss.IndexIVF) else None
        except ValueError:  # an IVF type shards never use
            found = None
        if (
            index.metric_type != faiss.METRIC_INNER_PRODUCT
            or (spec.is_ivf and found != spec)
            or (not spec.is_ivf and not isinstance(index, faiss.IndexIDMap2))
        ):
            raise IndexIntegrityError(
                f"{where} holds a {type(index).__name__} (metric {index.metric_type}"
                f"{f', {found}' if found else ''}), expected {expected}; {REBUILD_HINT}"
            )
        if index.d != dim:
            raise IndexIntegrityError(f"{where} has dimension {index.d}, the manifest says {dim}; {REBUILD_HINT}")
        if index.ntotal != expected_count:
            raise IndexIntegrityError(
                f"{where} holds {index.ntotal} vectors, the manifest says {expected_count}; {REBUILD_HINT}"
            )
        if spec.is_ivf:  # found == spec: an IndexIVF (spec_of above)
            ids, ordered = ivf_list_ids(cast(faiss.IndexIVF, index))
            if not ordered:  # the date filter binary-searches each list: it must be sorted
                raise IndexIntegrityError(f"{where}: an inverted list is not sorted by id; {REBUILD_HINT}")
        else:
            ids = faiss.vector_to_array(cast(faiss.IndexIDMap2, index).id_map).astype(np.int64, copy=False)
        lo, hi = ids_from(min_day), ids_through(max_day)
        outside = np.flatnonzero((ids < lo) | (ids >= hi))
        if outside.size:
            bad = int(ids[outside[0]])
            day = id_day(bad) if bad >= 0 else "no day"
            raise IndexIntegrityError(
                f"{where}: {outside.size} ids lie outside its days {min_day}..{max_day} "
                f"(e.g. id {bad}, {day}); {REBUILD_HINT}"
            )
        if np.unique(ids).size != ids.size:
            raise IndexIntegrityError(f"{where} holds duplicate ids; {REBUILD_HINT}")
        return cls(key, index, min_day, max_day, spec=spec, ids=ids)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the shard to `path` (not atomic: `indexer.snapshot.write_shard` is)."""
        Path(path).write_bytes(self.to_bytes().tobytes())

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        key: str,
        expected_count: int,
        dim: int,
        *,
        min_day: dt.date,
        max_day: dt.date,
        spec: ShardSpec = FLAT,
    ) -> MonthShard:
        """Read a shard file and check its type, count, dimension and that every id lies in [min_day, max_day].

        Raises:
            IndexIntegrityError: the file is missing or unreadable, or disagrees with the arguments.
        """
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise IndexIntegrityError(f"shard {key}: cannot read {path} ({exc.strerror}); {REBUILD_HINT}") from None
        return cls.from_bytes(
            data, key, expected_count, dim, min_day=min_day, max_day=max_day, source=str(path), spec=spec
        )


class ShardedIndex:
    """The shards of one snapshot, searched as one index restricted to `as_of`.

    Immutable: a new snapshot is a new ShardedIndex (shards may be shared between them), so
    searches in flight finish on the one they started with. Safe to search from many threads.
    """

    def __init__(self, shards: Iterable[MonthShard], *, dim: int | None = None):
        shards = tuple(sorted(shards, key=lambda s: s.min_day))
        dims = {s.dim for s in shards} | ({dim} if dim is not None else set())
        if len(dims) > 1:
            raise ValueError(f"shards disagree on dimension: {sorted(dims)}")
        if not dims:
            raise ValueError("an empty ShardedIndex needs its dim")
        settled = [s for s in shards if not is_live_key(s.key)]
        for prev, cur in zip(settled, settled[1:]):
            if cur.min_day <= prev.max_day:  # overlapping spans could return a passage twice
                raise ValueError(
                    f"shards {prev.key} ({prev.min_day}..{prev.max_day}) and "
                    f"{cur.key} ({cur.min_day}..{cur.max_day}) overlap"
                )
        self._shards = shards
        self._dim = dims.pop()

    def __repr__(self) -> str:
        return f"ShardedIndex({len(self._shards)} shards, {self.ntotal} vectors, {self.min_day}..{self.max_day})"

    @property
    def shards(self) -> tuple[MonthShard, ...]:
        return self._shards

    @property
    def dim(self) -> int:
        return self._dim

    @property
    def ntotal(self) -> int:
        return sum(s.ntotal for s in self._shards)

    @property
    def min_day(self) -> dt.date | None:
        return self._shards[0].min_day if self._shards else None

    @property
    def max_day(self) -> dt.date | None:
        return self._shards[-1].max_day if self._shards else None

    def search(self, queries: np.ndarray, as_of: dt.date, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-k passages published on or before `as_of` (inclusive), over all shards.

        Args:
            queries: (nq, dim) float32, L2-normalised like the passages.
            as_of: the last publication day that may be returned.
            k: results per query; when fewer passages qualify, the rest is id -1 with score -inf.
        Returns:
            scores (nq, k) float32 best first, ids (nq, k) int64.
        """
        q = as_queries(queries, self._dim)
        as_of, k = check_as_of(as_of), check_k(k)
        heap = faiss.ResultHeap(q.shape[0], k, keep_max=True)
        for shard in self._shards:
            if shard.min_day > as_of:
                break  # sorted by min_day: every later shard is after as_of too
            scores, ids = shard._search(q, min(k, shard.ntotal), as_of)  # (nq, <=k)
            heap.add_result(scores, ids)
        heap.finalize()
        scores, ids = heap.D, heap.I
        scores[ids < 0] = -np.inf
        return scores, ids


def _describe(a: object) -> str:
    if isinstance(a, np.ndarray):
        return f"array of shape {a.shape} and dtype {a.dtype}"
    return type(a).__name__
