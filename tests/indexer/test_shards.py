"""Date-filtered search over month shards, checked against brute force over the same subset."""

from __future__ import annotations

import datetime as dt
import threading

import faiss
import numpy as np
import pytest

from indexer import shards as shards_module
from indexer.dates import day_number
from indexer.ids import (
    ID_SHIFT,
    SEQ_LIMIT,
    id_day,
    id_day_numbers,
    id_seq,
    ids_from,
    ids_through,
    make_id,
    make_ids,
)
from indexer.index_errors import IndexIntegrityError
from indexer.shards import MonthShard, ShardedIndex

DIM = 16
D = dt.date

# (key, first day, last day, passages): a history shard over two months, then three months.
SPANS = [
    ("history-2023-01", D(2022, 11, 3), D(2022, 12, 30), 150),
    ("2023-01", D(2023, 1, 1), D(2023, 1, 31), 120),
    ("2023-02", D(2023, 2, 1), D(2023, 2, 28), 120),
    ("2023-03", D(2023, 3, 1), D(2023, 3, 31), 120),
]
FIRST_DAY_COUNT = 3  # passages on the very first day, to test padding

AS_OF_DAYS = [
    D(2022, 11, 2),  # before everything
    D(2022, 11, 3),  # the first day (only FIRST_DAY_COUNT passages)
    D(2022, 11, 30),  # inside the history shard
    D(2022, 12, 30),  # last day of the history shard
    D(2022, 12, 31),  # a day between shards
    D(2023, 1, 1),  # first day of a month
    D(2023, 1, 17),
    D(2023, 1, 31),  # last day of a month
    D(2023, 2, 1),
    D(2023, 2, 28),
    D(2023, 3, 15),
    D(2023, 3, 31),  # the last day
    D(2024, 6, 1),  # after everything
]


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def make_corpus(seed: int = 0):
    """Seeded passages over SPANS: (vectors (n, DIM), ids (n,), list of MonthShard)."""
    rng = np.random.default_rng(seed)
    seqs = rng.permutation(10_000)  # primary keys, unrelated to the day order
    vectors, ids, built, used = [], [], [], 0
    for i, (key, first, last, n) in enumerate(SPANS):
        lo, hi = day_number(first), day_number(last)
        days = rng.integers(lo, hi + 1, size=n)
        if i == 0:  # exactly FIRST_DAY_COUNT passages on the very first day
            days = np.where(days == lo, lo + 1, days)
            days[:FIRST_DAY_COUNT] = lo
        else:
            days[FIRST_DAY_COUNT] = lo  # always a passage on the span's first and last day
        days[FIRST_DAY_COUNT + 1] = hi
        shard_ids = make_ids(days, seqs[used : used + n])
        used += n
        shard_vectors = unit(rng, n)
        built.append(MonthShard.build(key, shard_vectors, shard_ids))
        vectors.append(shard_vectors)
        ids.append(shard_ids)
    return np.concatenate(vectors), np.concatenate(ids), built


@pytest.fixture(scope="module")
def corpus():
    return make_corpus()


def brute_force(vectors, ids, queries, as_of, k):
    """Exact top-k scores over the passages published on or before as_of: (nq, k), -inf padded."""
    keep = id_day_numbers(ids) <= day_number(as_of)
    scores = queries @ vectors[keep].T  # (nq, n_keep)
    top = -np.sort(-scores, axis=1)[:, :k]
    out = np.full((len(queries), k), -np.inf, dtype=np.float32)
    out[:, : top.shape[1]] = top
    return out


def check_against_brute_force(vectors, ids, queries, as_of, k, got_scores, got_ids):
    ref = brute_force(vectors, ids, queries, as_of, k)
    np.testing.assert_allclose(got_scores, ref, atol=1e-5)
    by_id = dict(zip(ids.tolist(), range(len(ids))))
    limit = day_number(as_of)
    for row in range(len(queries)):
        real = got_ids[row][got_ids[row] >= 0]
        assert len(set(real.tolist())) == len(real), "an id returned twice"
        assert (got_ids[row] >= 0).sum() == np.isfinite(ref[row]).sum()
        assert (id_day_numbers(real) <= limit).all()
        # each returned id really has the score reported for it
        exact = vectors[[by_id[i] for i in real.tolist()]] @ queries[row]
        np.testing.assert_allclose(got_scores[row][: len(real)], exact, atol=1e-5)


# --- ids ---------------------------------------------------------------------------------


def test_make_id_roundtrips_day_and_seq():
    for day, seq in [(D(1900, 1, 1), 0), (D(2023, 4, 2), 12345), (D(2099, 12, 31), SEQ_LIMIT - 1)]:
        i = make_id(day, seq)
        assert id_day(i) == day
        assert id_seq(i) == seq
        assert ids_from(day) <= i < ids_through(day)


def test_make_ids_matches_make_id():
    days = np.array([day_number(D(2023, 1, 1)), day_number(D(2023, 3, 31)), 0])
    seqs = np.array([5, 0, SEQ_LIMIT - 1])
    got = make_ids(days, seqs)
    assert got.dtype == np.int64
    assert got.tolist() == [make_id(D(2023, 1, 1), 5), make_id(D(2023, 3, 31), 0), SEQ_LIMIT - 1]
    assert id_day_numbers(np.append(got, -1)).tolist() == [*days.tolist(), -1]


def test_ids_through_is_the_exclusive_bound_of_the_day():
    day = D(2023, 2, 28)
    assert make_id(day, SEQ_LIMIT - 1) == ids_through(day) - 1
    assert ids_through(day) == make_id(D(2023, 3, 1), 0) == ids_from(D(2023, 3, 1))
    assert ids_through(day) >> ID_SHIFT == day_number(day) + 1


@pytest.mark.parametrize("seq", [-1, SEQ_LIMIT, SEQ_LIMIT + 7])
def test_make_id_rejects_seq_out_of_range(seq):
    with pytest.raises(ValueError, match=str(seq)):
        make_id(D(2023, 1, 1), seq)
    with pytest.raises(ValueError, match=str(seq)):
        make_ids(np.array([1, 2]), np.array([3, seq]))


def test_make_ids_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        make_ids(np.array([1, 2]), np.array([3]))


# --- MonthShard --------------------------------------------------------------------------


def test_month_shard_build_derives_days_and_keeps_ids(corpus):
    vectors, ids, built = corpus
    history, january = built[0], built[1]
    assert (history.min_day, history.max_day) == (D(2022, 11, 3), D(2022, 12, 30))
    assert (january.min_day, january.max_day) == (D(2023, 1, 1), D(2023, 1, 31))
    assert january.ntotal == 120 and january.dim == DIM
    assert np.array_equal(np.concatenate([s.ids() for s in built]), ids)


@pytest.mark.parametrize(
    "vectors, ids, message",
    [
        (np.zeros((0, DIM), np.float32), np.zeros(0, np.int64), "no vectors"),
        (np.ones((2, DIM), np.float64), np.array([1, 2], np.int64), "float32"),
        (np.ones(DIM, np.float32), np.array([1], np.int64), "2-d"),
        (np.ones((2, DIM), np.float32), np.array([1, 2], np.int32), "int64"),
        (np.ones((2, DIM), np.float32), np.array([1], np.int64), "2 vectors but 1 ids"),
        (np.full((1, DIM), np.nan, np.float32), np.array([1], np.int64), "NaN"),
    ],
)
def test_month_shard_build_rejects_bad_input(vectors, ids, message):
    with pytest.raises(ValueError, match=message):
        MonthShard.build("2023-01", vectors, ids)


def test_month_shard_build_rejects_duplicate_ids():
    dup = make_id(D(2023, 1, 5), 9)
    with pytest.raises(ValueError, match=f"duplicate id {dup}"):
        MonthShard.build("2023-01", unit(np.random.default_rng(1), 3), np.array([dup, dup + 1, dup], np.int64))


def test_month_shard_build_rejects_passages_outside_its_key():
    ids = np.array([make_id(D(2023, 1, 31), 1), make_id(D(2023, 2, 1), 2)], np.int64)
    with pytest.raises(ValueError, match="do not belong"):
        MonthShard.build("2023-01", unit(np.random.default_rng(1), 2), ids)
    with pytest.raises(ValueError, match="do not belong"):
        MonthShard.build("history-2023-02", unit(np.random.default_rng(1), 2), ids)
    with pytest.raises(ValueError, match="shard key"):
        MonthShard.build("2023/01", unit(np.random.default_rng(1), 2), ids)


def test_month_shard_search_filters_only_the_boundary_shard(corpus, monkeypatch):
    _, _, built = corpus
    january = built[1]
    made = []
    real = faiss.SearchParameters
    monkeypatch.setattr(shards_module.faiss, "SearchParameters", lambda **kw: made.append(kw) or real(**kw))
    q = unit(np.random.default_rng(2), 4)
    january.search(q, 5, as_of=D(2023, 1, 31))
    january.search(q, 5, as_of=D(2023, 5, 1))
    january.search(q, 5)
    assert made == []
    january.search(q, 5, as_of=D(2023, 1, 30))
    assert len(made) == 1


def test_month_shard_search_before_its_first_day_finds_nothing(corpus):
    _, _, built = corpus
    scores, ids = built[2].search(unit(np.random.default_rng(3), 2), 4, as_of=D(2023, 1, 31))
    assert (ids == -1).all() and np.isneginf(scores).all()
    assert scores.shape == ids.shape == (2, 4)


def test_month_shard_save_load_roundtrip(corpus, tmp_path):
    _, _, built = corpus
    shard = built[0]
    path = tmp_path / "h.faiss"
    shard.save(path)
    loaded = MonthShard.load(path, shard.key, shard.ntotal, DIM, min_day=shard.min_day, max_day=shard.max_day)
    assert np.array_equal(loaded.ids(), shard.ids())
    assert (loaded.key, loaded.min_day, loaded.max_day, loaded.dim) == (shard.key, shard.min_day, shard.max_day, DIM)
    q = unit(np.random.default_rng(4), 5)
    for as_of in (D(2022, 11, 20), D(2023, 1, 1)):
        for a, b in zip(loaded.search(q, 7, as_of), shard.search(q, 7, as_of)):
            assert np.array_equal(a, b)


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(expected_count=151), "holds 150 vectors, the manifest says 151"),
        (dict(dim=DIM + 1), "dimension 16"),
        (dict(min_day=D(2022, 11, 4)), "outside its days"),
        (dict(max_day=D(2022, 12, 29)), "outside its days"),
    ],
)
def test_month_shard_load_rejects_disagreement(corpus, tmp_path, change, message):
    shard = corpus[2][0]
    path = tmp_path / "h.faiss"
    shard.save(path)
    args = dict(expected_count=shard.ntotal, dim=DIM, min_day=shard.min_day, max_day=shard.max_day) | change
    with pytest.raises(IndexIntegrityError, match=message) as err:
        MonthShard.load(path, shard.key, **args)
    assert "sqa index rebuild" in str(err.value)


def test_month_shard_load_rejects_garbage_and_missing_files(tmp_path):
    path = tmp_path / "bad.faiss"
    path.write_bytes(b"not an index")
    kw = dict(min_day=D(2023, 1, 1), max_day=D(2023, 1, 2))
    with pytest.raises(IndexIntegrityError, match="not a readable FAISS index"):
        MonthShard.load(path, "2023-01", 1, DIM, **kw)
    with pytest.raises(IndexIntegrityError, match="cannot read"):
        MonthShard.load(tmp_path / "nope.faiss", "2023-01", 1, DIM, **kw)


# --- ShardedIndex ------------------------------------------------------------------------


@pytest.mark.parametrize("as_of", AS_OF_DAYS, ids=str)
def test_sharded_index_search_matches_brute_force(corpus, as_of):
    vectors, ids, built = corpus
    index = ShardedIndex(reversed(built))  # order given does not matter
    queries = unit(np.random.default_rng(day_number(as_of)), 8)
    for k in (1, 10, 60):
        scores, got = index.search(queries, as_of, k)
        assert scores.shape == got.shape == (8, k)
        assert scores.dtype == np.float32 and got.dtype == np.int64
        check_against_brute_force(vectors, ids, queries, as_of, k, scores, got)


def test_sharded_index_search_boundary_day_is_inclusive(corpus):
    vectors, ids, built = corpus
    index = ShardedIndex(built)
    for day in (D(2022, 11, 3), D(2022, 12, 30), D(2023, 1, 1), D(2023, 1, 31), D(2023, 2, 1), D(2023, 3, 31)):
        on_day = np.flatnonzero(id_day_numbers(ids) == day_number(day))
        assert on_day.size, f"the corpus must hold a passage on {day}"
        target = on_day[0]
        q = vectors[target : target + 1]  # the passage itself is its own best match
        _, got = index.search(q, day, 1)
        assert got[0, 0] == ids[target]
        _, got = index.search(q, day - dt.timedelta(days=1), 5)
        assert ids[target] not in got


def test_sharded_index_search_pads_when_fewer_than_k(corpus):
    vectors, ids, built = corpus
    index = ShardedIndex(built)
    q = unit(np.random.default_rng(5), 3)
    scores, got = index.search(q, D(2022, 11, 3), 10)
    assert (got[:, :FIRST_DAY_COUNT] >= 0).all()
    assert (got[:, FIRST_DAY_COUNT:] == -1).all()
    assert np.isneginf(scores[:, FIRST_DAY_COUNT:]).all()
    scores, got = index.search(q, D(2022, 1, 1), 4)
    assert (got == -1).all() and np.isneginf(scores).all()
    scores, got = index.search(q, D(2030, 1, 1), len(ids) + 5)
    assert sorted(got[0, : len(ids)].tolist()) == sorted(ids.tolist())
    assert (got[:, len(ids) :] == -1).all()


def test_sharded_index_search_never_returns_a_later_day(corpus):
    vectors, ids, built = corpus
    index = ShardedIndex(built)
    rng = np.random.default_rng(6)
    lo, hi = day_number(D(2022, 10, 25)), day_number(D(2023, 4, 5))
    for _ in range(150):
        as_of = D(1900, 1, 1) + dt.timedelta(days=int(rng.integers(lo, hi)))
        _, got = index.search(unit(rng, 4), as_of, int(rng.integers(1, 40)))
        days = id_day_numbers(got[got >= 0])
        assert (days <= day_number(as_of)).all(), f"a passage after {as_of} was returned"


def test_sharded_index_properties(corpus):
    vectors, ids, built = corpus
    index = ShardedIndex(reversed(built))
    assert index.ntotal == len(ids)
    assert index.dim == DIM
    assert (index.min_day, index.max_day) == (D(2022, 11, 3), D(2023, 3, 31))
    assert [s.key for s in index.shards] == [key for key, *_ in SPANS]
    empty = ShardedIndex([], dim=DIM)
    assert (empty.ntotal, empty.min_day, empty.max_day) == (0, None, None)
    scores, got = empty.search(unit(np.random.default_rng(7), 2), D(2023, 1, 1), 3)
    assert (got == -1).all() and np.isneginf(scores).all()


def test_sharded_index_rejects_bad_arguments(corpus):
    index = ShardedIndex(corpus[2])
    q = unit(np.random.default_rng(8), 2)
    with pytest.raises(ValueError, match="k must be a positive integer, got 0"):
        index.search(q, D(2023, 1, 1), 0)
    with pytest.raises(ValueError, match=r"shape \(nq, 16\)"):
        index.search(unit(np.random.default_rng(8), 2, DIM + 1), D(2023, 1, 1), 3)
    with pytest.raises(ValueError, match=r"shape \(nq, 16\)"):
        index.search(q[0], D(2023, 1, 1), 3)
    with pytest.raises(TypeError, match="as_of must be a datetime.date"):
        index.search(q, dt.datetime(2023, 1, 1, tzinfo=dt.UTC), 3)
    with pytest.raises(TypeError, match="as_of must be a datetime.date"):
        index.search(q, 3, D(2023, 1, 1))  # arguments swapped


def test_sharded_index_rejects_overlapping_or_mixed_shards(corpus):
    built = corpus[2]
    rng = np.random.default_rng(9)
    late = MonthShard.build("extra", unit(rng, 1), np.array([make_id(D(2023, 1, 10), 99_999)], np.int64))
    with pytest.raises(ValueError, match="overlap"):
        ShardedIndex([*built, late])
    wide = MonthShard.build("2024-01", unit(rng, 1, DIM * 2), np.array([make_id(D(2024, 1, 1), 1)], np.int64))
    with pytest.raises(ValueError, match="dimension"):
        ShardedIndex([*built, wide])
    with pytest.raises(ValueError, match="needs its dim"):
        ShardedIndex([])


def test_sharded_index_search_is_thread_safe(corpus):
    vectors, ids, built = corpus
    index = ShardedIndex(built)
    rng = np.random.default_rng(10)
    jobs = [(unit(rng, 3), AS_OF_DAYS[i % len(AS_OF_DAYS)]) for i in range(64)]
    expected = [index.search(q, as_of, 12) for q, as_of in jobs]
    results, errors = [None] * len(jobs), []

    def work(start):
        try:
            for i in range(start, len(jobs), 8):
                results[i] = index.search(jobs[i][0], jobs[i][1], 12)
        except Exception as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    for (s1, i1), (s2, i2) in zip(results, expected):
        assert np.array_equal(i1, i2) and np.array_equal(s1, s2)


def test_month_shard_search_boundary_uses_extreme_seqs():
    day = D(2023, 1, 15)
    nxt = day + dt.timedelta(days=1)
    ids = np.array([make_id(day, 0), make_id(day, SEQ_LIMIT - 1), make_id(nxt, 0), make_id(D(2023, 1, 31), 1)])
    shard = MonthShard.build("2023-01", unit(np.random.default_rng(11), 4), ids)
    _, got = shard.search(unit(np.random.default_rng(12), 2), 4, as_of=day)
    assert sorted(got[0].tolist()) == [-1, -1, *sorted(ids[:2].tolist())]
    _, got = shard.search(unit(np.random.default_rng(12), 2), 4, as_of=nxt)
    assert sorted(got[0].tolist()) == [-1, *sorted(ids[:3].tolist())]


def test_month_shard_load_rejects_duplicate_ids(tmp_path):
    index = faiss.IndexIDMap2(faiss.IndexFlatIP(DIM))
    dup = make_id(D(2023, 1, 5), 3)
    index.add_with_ids(unit(np.random.default_rng(13), 2), np.array([dup, dup], np.int64))
    path = tmp_path / "dup.faiss"
    faiss.write_index(index, str(path))
    with pytest.raises(IndexIntegrityError, match="duplicate ids"):
        MonthShard.load(path, "2023-01", 2, DIM, min_day=D(2023, 1, 1), max_day=D(2023, 1, 31))
