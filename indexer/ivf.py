"""Shard index types: exact flat, or IVF (flat, 8-bit scalar or product-quantised codes) for large shards.

A `ShardSpec` says which FAISS index a shard holds and how it is searched; it is recorded in the
manifest entry and checked against the file on load. A `ShardPolicy` picks the spec from the
shard's size: flat below `ivf_min` vectors (exact, and fast enough there), IVF-Flat up to
`compressed_min`, then IVF with compressed codes (`codec`: "sq8" or "pq").

IVF shards add their vectors in id order, so every inverted list is sorted by id, and ids sort by
publication day (`indexer.ids`). A date filter "published on or before as_of" is then a prefix of
each list: `IDSelectorRange(lo, hi, assume_sorted=True)` lets FAISS binary-search each list and
scan only its in-range part, with no per-id check. The rule that keeps recall under a restrictive
filter (see `filtered_nprobe`): probe nprobe / share lists, where share is the fraction of the
shard's passages the filter keeps, capped at nlist. Only the in-range part of each list is
scanned, so that computes about as many distances as an unfiltered search, plus a fixed cost per
probed list (a binary search, ~1 us). Once nprobe / share reaches nlist (share <= nprobe / nlist,
1/16 with the default nprobe) every list is probed: an exhaustive search over the range, exact
for IVF-Flat. The filter is applied only in the boundary shard (`ShardedIndex`), so with month
shards it narrows at most one month.

Example:
    >>> spec = ShardPolicy(ivf_min=100_000).spec_for(250_000, 384)   # ShardSpec('ivf-flat', nlist=2048, nprobe=128)
    >>> index = build_ivf(vectors_sorted, ids_sorted, spec)          # (n, 384) float32, (n,) int64 ascending
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import faiss
import numpy as np

SHARD_KINDS = ("flat", "ivf-flat", "ivf-sq8", "ivf-pq")
CODECS = ("sq8", "pq")
TRAIN_PER_LIST = 64  # k-means training points per inverted list (FAISS warns below 39)
MIN_PER_LIST = 39
PROBE_SHARE = 16  # an unfiltered search probes nlist / PROBE_SHARE lists (recall@10 ~0.97, see bench_ivf.py)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass(frozen=True)
class ShardSpec:
    """The index type of one shard, as its manifest entry records it.

    kind: "flat" (exact), "ivf-flat", "ivf-sq8" or "ivf-pq"; nlist: inverted lists; nprobe: lists an
    unfiltered query probes; pq_m / pq_nbits: sub-quantizers and bits per code (ivf-pq only).
    Fields that do not apply to the kind are 0.
    """

    kind: str = "flat"
    nlist: int = 0
    nprobe: int = 0
    pq_m: int = 0
    pq_nbits: int = 0

    def __post_init__(self) -> None:
        if self.kind not in SHARD_KINDS:
            raise ValueError(f"shard kind {self.kind!r} is not one of {', '.join(SHARD_KINDS)}")
        for name in ("nlist", "nprobe", "pq_m", "pq_nbits"):
            v = getattr(self, name)
            if not _is_int(v) or v < 0:
                raise ValueError(f"shard {name} {v!r} must be a non-negative integer")
        if self.kind == "flat":
            if self.nlist or self.nprobe or self.pq_m or self.pq_nbits:
                raise ValueError(f"a flat shard has no IVF parameters, got {self}")
            return
        if self.nlist < 1 or not 1 <= self.nprobe <= self.nlist:
            raise ValueError(f"{self.kind} shard needs nlist >= 1 and 1 <= nprobe <= nlist, got {self}")
        if self.kind == "ivf-pq":
            if self.pq_m < 1 or not 1 <= self.pq_nbits <= 16:
                raise ValueError(f"ivf-pq shard needs pq_m >= 1 and 1 <= pq_nbits <= 16, got {self}")
        elif self.pq_m or self.pq_nbits:
            raise ValueError(f"{self.kind} shard has no PQ parameters, got {self}")

    @property
    def is_ivf(self) -> bool:
        return self.kind != "flat"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


FLAT = ShardSpec()


def default_nlist(n: int) -> int:
    """Power of two nearest 4 * sqrt(n), with at least MIN_PER_LIST vectors per list to train on."""
    nlist: int = 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n))))
    while nlist > 1 and nlist * MIN_PER_LIST > n:
        nlist //= 2
    return nlist


def default_nprobe(nlist: int) -> int:
    return max(1, math.ceil(nlist / PROBE_SHARE))


def default_pq_m(dim: int) -> int:
    """Sub-quantizers of about 8 dimensions each (384 -> 48); must divide dim."""
    m = max(1, dim // 8)
    while dim % m:
        m -= 1
    return m


def ivf_spec(
    kind: str, n: int, dim: int, *, nlist: int = 0, nprobe: int = 0, pq_m: int = 0, pq_nbits: int = 8
) -> ShardSpec:
    """A spec of `kind` for a shard of n vectors; 0 means the default for that size."""
    if kind == "flat":
        return FLAT
    nlist = nlist or default_nlist(n)
    if kind == "ivf-pq":
        return ShardSpec(kind, nlist, min(nlist, nprobe or default_nprobe(nlist)), pq_m or default_pq_m(dim), pq_nbits)
    return ShardSpec(kind, nlist, min(nlist, nprobe or default_nprobe(nlist)))


@dataclass(frozen=True)
class ShardPolicy:
    """Which spec a new shard gets, by its number of vectors (settings SQA_IVF_*)."""

    ivf_min: int = 100_000  # flat below: an exact scan of 100k x 384 is ~5 ms on one core
    compressed_min: int = 1_000_000  # IVF-Flat below (1.5 KB per passage), compressed codes from here
    codec: str = "sq8"  # "sq8": 384 B per passage, recall ~ IVF-Flat; "pq": 48 B, recall much lower

    def __post_init__(self) -> None:
        if not _is_int(self.ivf_min) or not _is_int(self.compressed_min) or self.ivf_min < 1:
            raise ValueError(f"shard policy thresholds must be positive integers, got {self}")
        if self.compressed_min < self.ivf_min:
            raise ValueError(f"compressed_min {self.compressed_min} is below ivf_min {self.ivf_min}")
        if self.codec not in CODECS:
            raise ValueError(f"IVF codec {self.codec!r} is not one of {', '.join(CODECS)}")

    def spec_for(self, n: int, dim: int) -> ShardSpec:
        if n < self.ivf_min:
            return FLAT
        kind = "ivf-flat" if n < self.compressed_min else f"ivf-{self.codec}"
        return ivf_spec(kind, n, dim)


def _new_ivf(dim: int, spec: ShardSpec) -> faiss.IndexIVF:
    quantizer = faiss.IndexFlatIP(dim)  # the wrapper keeps a reference; deserialised ones own it
    ip = faiss.METRIC_INNER_PRODUCT
    if spec.kind == "ivf-flat":
        return faiss.IndexIVFFlat(quantizer, dim, spec.nlist, ip)
    if spec.kind == "ivf-sq8":
        return faiss.IndexIVFScalarQuantizer(quantizer, dim, spec.nlist, faiss.ScalarQuantizer.QT_8bit, ip)
    if dim % spec.pq_m:
        raise ValueError(f"pq_m {spec.pq_m} must divide the dimension {dim}")
    return faiss.IndexIVFPQ(quantizer, dim, spec.nlist, spec.pq_m, spec.pq_nbits, ip)


def build_ivf(vectors: np.ndarray, ids: np.ndarray, spec: ShardSpec, *, seed: int = 1234) -> faiss.IndexIVF:
    """Train and fill an IVF index of `spec.kind`.

    Args:
        vectors: (n, dim) float32, in the order of `ids`.
        ids: (n,) int64, strictly ascending (so every inverted list ends up sorted by id).
        spec: an IVF spec; n must be at least spec.nlist.
    Returns:
        the IndexIVF, its nprobe set to spec.nprobe.
    """
    n, dim = vectors.shape
    if not spec.is_ivf:
        raise ValueError("build_ivf needs an IVF spec, got a flat one")
    if n < spec.nlist:
        raise ValueError(f"{n} vectors cannot train {spec.nlist} inverted lists (use a flat shard or fewer lists)")
    if ids.shape != (n,) or (n > 1 and not (np.diff(ids) > 0).all()):
        raise ValueError("IVF shard ids must be strictly ascending, one per vector")
    index = _new_ivf(dim, spec)
    index.cp.seed = seed
    rng = np.random.default_rng(seed)
    n_train = min(n, TRAIN_PER_LIST * spec.nlist)
    sample = vectors if n_train == n else vectors[np.sort(rng.choice(n, n_train, replace=False))]
    index.train(np.ascontiguousarray(sample))
    step = 1 << 18  # add in chunks: bounded temporary memory, list order unchanged
    for start in range(0, n, step):
        index.add_with_ids(np.ascontiguousarray(vectors[start : start + step]), ids[start : start + step])
    index.nprobe = spec.nprobe
    return index


def spec_of(index: faiss.Index, nprobe: int) -> ShardSpec:
    """The spec a loaded index matches (nprobe is not part of the file's identity: given)."""
    if isinstance(index, faiss.IndexIVFFlat):
        return ShardSpec("ivf-flat", int(index.nlist), nprobe)
    if isinstance(index, faiss.IndexIVFScalarQuantizer):
        if index.sq.qtype != faiss.ScalarQuantizer.QT_8bit:
            raise ValueError(f"scalar quantizer type {index.sq.qtype} is not 8-bit")
        return ShardSpec("ivf-sq8", int(index.nlist), nprobe)
    if isinstance(index, faiss.IndexIVFPQ):
        return ShardSpec("ivf-pq", int(index.nlist), nprobe, int(index.pq.M), int(index.pq.nbits))
    raise ValueError(f"{type(index).__name__} is not a shard index type")


def ivf_list_ids(index: faiss.IndexIVF) -> tuple[np.ndarray, bool]:
    """All ids of an IVF index, list after list, and whether every list is sorted ascending."""
    invlists = index.invlists
    assert invlists is not None  # an IndexIVF always has its inverted lists
    parts: list[np.ndarray] = []
    ordered = True
    for lst in range(index.nlist):
        size = invlists.list_size(lst)
        if size == 0:
            continue
        ptr = invlists.get_ids(lst)
        try:
            ids = faiss.rev_swig_ptr(ptr, size).copy()  # (size,) int64
        finally:
            invlists.release_ids(lst, ptr)  # type: ignore[attr-defined]  # in faiss, not in its stubs
        ordered = ordered and bool((np.diff(ids) > 0).all())
        parts.append(ids)
    return (np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)), ordered


def filtered_nprobe(nprobe: int, nlist: int, share: float) -> int:
    """Lists to probe when the date filter keeps `share` (0..1] of the shard: nprobe / share, at most nlist.

    Dates are independent of where a vector lies, so probing 1/share times more lists finds about as
    many in-range candidates as an unfiltered search finds candidates. A gentler nprobe / sqrt(share)
    holds recall on smooth data (bench_ivf.py's) at a third of the lists, but not on data of many
    small clusters (tests/indexer/test_ivf.py: 0.91 instead of 0.996 at 10%), where the filter's
    top-k come from about 1/share times more clusters; news, with many near-duplicate stories, is
    closer to the latter, so the rule keeps recall rather than the lists' fixed cost.
    """
    if share >= 1.0:
        return nprobe
    if share <= 0.0:
        return nlist
    return min(nlist, math.ceil(nprobe / share))


def ivf_search_params(spec: ShardSpec, share: float, lo: int, hi: int | None) -> faiss.SearchParametersIVF:
    """Search parameters for an IVF shard; `hi` None means unfiltered, else ids in [lo, hi)."""
    # faiss's stubs declare SearchParameters.__init__(self) only; its Python wrapper takes the fields as keywords
    if hi is None:
        return faiss.SearchParametersIVF(nprobe=spec.nprobe)  # type: ignore[call-arg]
    selector = faiss.IDSelectorRange(lo, hi, True)  # assume_sorted: lists are sorted by id
    nprobe = filtered_nprobe(spec.nprobe, spec.nlist, share)
    params = faiss.SearchParametersIVF(sel=selector, nprobe=nprobe)  # type: ignore[call-arg]
    params.referenced_selector = selector  # type: ignore[attr-defined]  # keep it alive as long as the parameters
    return params
