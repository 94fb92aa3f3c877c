"""IVF shards: chosen by size, recorded in the manifest and reloaded exactly, date-filtered search
that never returns a passage after as_of and keeps recall against exact search under a 1% filter."""

from __future__ import annotations

import datetime as dt

import faiss
import numpy as np
import pytest

from indexer.dates import day_number
from indexer.ids import id_day, ids_from, ids_through, make_ids
from indexer.index_errors import IndexIntegrityError
from indexer.ivf import FLAT, ShardPolicy, ShardSpec, filtered_nprobe, ivf_spec
from indexer.manifest import Manifest, read_manifest, write_manifest
from indexer.shards import MonthShard, ShardedIndex
from indexer.snapshot import ShardCache, write_shard

D = dt.date
DIM = 32
FIRST, LAST = D(2020, 1, 1), D(2022, 12, 31)  # a history shard over three years (1096 days)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def clustered(rng: np.random.Generator, n: int, centers: np.ndarray) -> np.ndarray:
    """(n, DIM) unit vectors around random centers: IVF's lists mean something, as with real embeddings."""
    return unit(centers[rng.integers(0, len(centers), n)] + 0.5 * unit(rng.standard_normal((n, DIM))))


@pytest.fixture(scope="module")
def corpus():
    """12,000 passages spread uniformly over the three years (ids in random order), 100 queries."""
    rng = np.random.default_rng(0)
    centers = unit(rng.standard_normal((1000, DIM)))  # unfiltered IVF recall@10 ~0.98: not trivial
    n = 12_000
    days = rng.integers(day_number(FIRST), day_number(LAST) + 1, size=n)
    ids = make_ids(days, rng.permutation(10 * n)[:n])
    return clustered(rng, n, centers), ids, clustered(rng, 100, centers)


def exact(vectors, ids, queries, as_of, k=10):
    """Brute-force top-k ids among passages published on or before as_of."""
    keep = ids < ids_through(as_of)
    _, pos = faiss.knn(queries, vectors[keep], k, faiss.METRIC_INNER_PRODUCT)
    return ids[keep][pos]


def recall(found: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(f[f >= 0]) & set(t)) / len(t) for f, t in zip(found, truth)]))


def as_of_for_share(ids: np.ndarray, share: float) -> dt.date:
    """The day through which about `share` of the passages were published."""
    return id_day(int(np.sort(ids)[int(share * len(ids))]))


@pytest.mark.parametrize("kind", ["ivf-flat", "ivf-sq8", "ivf-pq"])
def test_ivf_shard_roundtrip_keeps_spec_and_results(tmp_path, corpus, kind):
    vectors, ids, queries = corpus
    spec = ivf_spec(kind, len(ids), DIM)
    shard = MonthShard.build("history-2023-01", vectors, ids, spec=spec)
    entry = write_shard(tmp_path, shard)
    name, _ = write_manifest(tmp_path, Manifest.new("enc", DIM).with_shard(entry))
    reread = read_manifest(tmp_path, name)
    assert reread.shards[0].index == spec and spec.kind == kind and spec.nlist > 1
    loaded = ShardCache().open_snapshot(tmp_path, reread, expected_encoder="enc", expected_dim=DIM).shards[0]
    assert loaded.spec == spec and loaded.ntotal == len(ids)
    assert sorted(loaded.ids()) == sorted(ids)
    for as_of in (None, as_of_for_share(ids, 0.3)):
        s1, i1 = shard.search(queries, 10, as_of)
        s2, i2 = loaded.search(queries, 10, as_of)
        np.testing.assert_array_equal(i1, i2)
        np.testing.assert_allclose(s1, s2)


def test_ivf_shard_filtered_recall_at_one_percent(corpus):
    """The rule nprobe / share keeps recall@10 of filtered IVF-Flat search >= 0.95 against exact;
    the shard's own nprobe under the same filter would not."""
    vectors, ids, queries = corpus
    shard = MonthShard.build("history-2023-01", vectors, ids, spec=ivf_spec("ivf-flat", len(ids), DIM))
    for share in (0.01, 0.1):
        as_of = as_of_for_share(ids, share)
        truth = exact(vectors, ids, queries, as_of)
        _, found = shard.search(queries, 10, as_of)
        assert recall(found, truth) >= 0.95, share
        fixed = faiss.SearchParametersIVF(
            sel=faiss.IDSelectorRange(0, ids_through(as_of), True), nprobe=shard.spec.nprobe
        )
        _, found_fixed = shard._index.search(queries, 10, params=fixed)
        assert recall(found_fixed, truth) < 0.9, share


@pytest.mark.parametrize("kind", ["ivf-flat", "ivf-sq8", "ivf-pq"])
def test_ivf_search_never_returns_a_passage_after_as_of(corpus, kind):
    vectors, ids, queries = corpus
    # A history shard before 2022-10 (IVF of `kind`), then three month shards of ~330 passages (flat).
    policy = ShardPolicy(
        ivf_min=1000, compressed_min=10**9 if kind == "ivf-flat" else 1000, codec="pq" if kind == "ivf-pq" else "sq8"
    )
    spans = [
        ("history-2022-10", FIRST, D(2022, 9, 30)),
        ("2022-10", D(2022, 10, 1), D(2022, 10, 31)),
        ("2022-11", D(2022, 11, 1), D(2022, 11, 30)),
        ("2022-12", D(2022, 12, 1), D(2022, 12, 31)),
    ]
    shards = []
    for key, lo, hi in spans:
        keep = (ids >= ids_from(lo)) & (ids < ids_through(hi))
        shards.append(MonthShard.build(key, vectors[keep], ids[keep], spec=policy.spec_for(int(keep.sum()), DIM)))
    assert shards[0].spec.kind == kind and shards[1].spec == FLAT  # ~330 passages a month: flat
    index = ShardedIndex(shards)
    for as_of in (
        D(2019, 12, 31),
        FIRST,
        D(2020, 1, 15),
        D(2021, 6, 30),
        D(2022, 9, 30),
        D(2022, 10, 1),
        D(2022, 11, 17),
        LAST,
        D(2024, 1, 1),
    ):
        scores, found = index.search(queries, as_of, 10)
        got = found[found >= 0]
        assert all(id_day(int(i)) <= as_of for i in got), as_of
        assert np.isneginf(scores[found < 0]).all()
        n_ok = int((ids < ids_through(as_of)).sum())
        assert (found >= 0).sum(axis=1).min() == min(10, n_ok)  # never fewer results than exist


def test_ivf_load_rejects_a_file_that_disagrees_with_its_entry(tmp_path, corpus):
    vectors, ids, _ = corpus
    shard = MonthShard.build("history-2023-01", vectors, ids, spec=ivf_spec("ivf-flat", len(ids), DIM))
    data = shard.to_bytes()
    kwargs = {"min_day": FIRST, "max_day": LAST}
    wrong = ShardSpec("ivf-pq", shard.spec.nlist, shard.spec.nprobe, 4, 8)
    with pytest.raises(IndexIntegrityError, match="expected an inner-product"):
        MonthShard.from_bytes(data, "history-2023-01", len(ids), DIM, spec=wrong, **kwargs)
    with pytest.raises(IndexIntegrityError, match="expected an inner-product IndexIDMap2"):
        MonthShard.from_bytes(data, "history-2023-01", len(ids), DIM, **kwargs)  # the entry says flat

    # Lists not sorted by id would make the date filter's binary search wrong: refused on load.
    index = faiss.IndexIVFFlat(faiss.IndexFlatIP(DIM), DIM, 16, faiss.METRIC_INNER_PRODUCT)
    index.train(vectors)
    index.add_with_ids(vectors, ids)  # ids in random order
    spec = ShardSpec("ivf-flat", 16, 2)
    with pytest.raises(IndexIntegrityError, match="not sorted by id"):
        MonthShard.from_bytes(faiss.serialize_index(index), "history-2023-01", len(ids), DIM, spec=spec, **kwargs)


def test_shard_policy_spec_for_picks_the_type_by_size():
    policy = ShardPolicy(ivf_min=100_000, compressed_min=1_000_000, codec="pq")
    assert policy.spec_for(99_999, 384) == FLAT
    mid = policy.spec_for(250_000, 384)
    assert (mid.kind, mid.nlist, mid.nprobe) == ("ivf-flat", 2048, 128)
    big = policy.spec_for(4_000_000, 384)
    assert (big.kind, big.nlist, big.pq_m, big.pq_nbits) == ("ivf-pq", 8192, 48, 8)
    assert ShardPolicy(codec="sq8").spec_for(2_000_000, 384).kind == "ivf-sq8"
    with pytest.raises(ValueError, match="below ivf_min"):
        ShardPolicy(ivf_min=10, compressed_min=5)
    with pytest.raises(ValueError, match="codec"):
        ShardPolicy(codec="opq")


def test_shard_spec_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="no IVF parameters"):
        ShardSpec("flat", nlist=4)
    with pytest.raises(ValueError, match="nprobe <= nlist"):
        ShardSpec("ivf-flat", nlist=4, nprobe=8)
    with pytest.raises(ValueError, match="pq_m"):
        ShardSpec("ivf-pq", nlist=4, nprobe=1)
    with pytest.raises(ValueError, match="not one of"):
        ShardSpec("hnsw")


def test_filtered_nprobe_raises_probes_by_one_over_the_share():
    assert filtered_nprobe(16, 1024, 1.0) == 16
    assert filtered_nprobe(16, 1024, 0.5) == 32
    assert filtered_nprobe(16, 1024, 0.1) == 160
    assert filtered_nprobe(16, 1024, 0.01) == 1024  # every list: exhaustive over the range
    assert filtered_nprobe(16, 1024, 0.0) == 1024


def test_flat_manifest_entry_json_has_no_index_or_bm25_fields(tmp_path, corpus):
    """Manifests of flat shards without BM25 read and write exactly as before these fields existed."""
    vectors, ids, _ = corpus
    entry = write_shard(tmp_path, MonthShard.build("history-2023-01", vectors[:50], ids[:50]))
    text = Manifest.new("enc", DIM).with_shard(entry).to_json()
    assert '"index"' not in text and '"bm25"' not in text
    assert Manifest.from_json(text).shards[0] == entry
