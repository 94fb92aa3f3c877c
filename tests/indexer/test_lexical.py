"""BM25 shards: exact-term retrieval, the same date filter as the vectors, files beside the shards."""

from __future__ import annotations

import datetime as dt
import os
import time

import numpy as np
import pytest

from indexer.dates import day_number
from indexer.ids import id_day, make_ids
from indexer.index_errors import IndexIntegrityError
from indexer.lexical import Bm25Shard, LexicalIndex, tokenize
from indexer.manifest import Manifest, read_manifest, write_manifest
from indexer.shards import MonthShard, ShardedIndex
from indexer.snapshot import LexicalMissingError, ShardCache, garbage_files, write_shard
from models.encoders import HashEncoder
from models.readers import dated_question

D = dt.date
WORDS = ["harbour", "council", "budget", "storm", "election", "festival", "bridge", "school", "river", "market"]


def month_corpus(month: int, n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """n passages of 2024-<month>, two random words each plus 'news', ids in random order."""
    rng = np.random.default_rng(seed)
    days = rng.integers(day_number(D(2024, month, 1)), day_number(D(2024, month, 28)) + 1, size=n)
    texts = [f"news about the {WORDS[a]} and the {WORDS[b]}" for a, b in rng.integers(0, len(WORDS), (n, 2))]
    return texts, make_ids(days, rng.permutation(1000)[:n] + 1000 * month)


def test_bm25_finds_an_exact_term_passage_the_hash_encoder_misses():
    """A rare name mentioned once in a long passage: BM25 ranks it first, the dense (hash) encoder last."""
    as_of = D(2024, 2, 20)
    texts = [
        (
            "Tuesday, February 20, 2024. Today the city council met to discuss who is responsible for the budget "
            "and who founded the new committee."
        ),
        (
            "Tuesday, February 20, 2024. Who is the mayor today? The council says the mayor is the one who founded "
            "the party."
        ),
        "Monday, February 19, 2024. Today is a holiday and the council is closed, who knows for how long.",
        (
            "Thursday, February 1, 2024. Officials confirmed the harbour works will finish in spring. Engineers from "
            "Velmora Dynamics, a firm started in the northern valley decades ago by an inventor named Quillon "
            "Ashgrove, supplied the cranes, the pumps and the floating barriers for the new quay."
        ),
    ]
    ids = make_ids(np.array([day_number(D(2024, 2, d)) for d in (20, 20, 19, 1)]), np.arange(4))
    question = "Who founded Velmora Dynamics?"
    encoder = HashEncoder()
    dense = ShardedIndex([MonthShard.build("2024-02", encoder.encode_passages(texts), ids)])
    _, dense_ids = dense.search(encoder.encode_queries([dated_question(question, as_of)]), as_of, 3)
    assert ids[3] not in dense_ids[0]
    _, bm25_ids = LexicalIndex([Bm25Shard.build("2024-02", texts, ids)]).search([question], as_of, 3)
    assert bm25_ids[0, 0] == ids[3]


def test_bm25_search_respects_the_date_filter():
    shards, all_texts, all_ids = [], [], []
    for month in (1, 2, 3):
        texts, ids = month_corpus(month, 200, seed=month)
        shards.append(Bm25Shard.build(f"2024-{month:02d}", texts, ids))
        all_texts += texts
        all_ids.append(ids)
    all_ids = np.concatenate(all_ids)
    index = LexicalIndex(shards)
    has_term = np.array(["storm" in t for t in all_texts])
    for as_of in (
        D(2023, 12, 31),
        D(2024, 1, 1),
        D(2024, 1, 14),
        D(2024, 2, 1),
        D(2024, 2, 28),
        D(2024, 3, 10),
        D(2025, 1, 1),
    ):
        scores, ids = index.search(["storm warnings"], as_of, 50)
        got = ids[0][ids[0] >= 0]
        assert all(id_day(int(i)) <= as_of for i in got)
        published = np.array([id_day(int(i)) <= as_of for i in all_ids])
        assert len(got) == min(50, int((has_term & published).sum())), as_of  # every match, never more
        assert (np.diff(scores[0][: len(got)]) <= 0).all()
        assert np.isneginf(scores[0][len(got) :]).all()


def test_bm25_search_pads_when_no_word_matches():
    texts, ids = month_corpus(1, 20, seed=0)
    scores, found = LexicalIndex([Bm25Shard.build("2024-01", texts, ids)]).search(
        ["zebra", "", "the"], D(2024, 1, 31), 5
    )
    assert (found == -1).all() and np.isneginf(scores).all()


def test_bm25_shard_roundtrip_and_corrupt_bytes():
    texts, ids = month_corpus(2, 100, seed=5)
    shard = Bm25Shard.build("2024-02", texts, ids)
    data = shard.to_bytes()
    loaded = Bm25Shard.from_bytes(data, "2024-02", 100)
    np.testing.assert_array_equal(loaded.ids(), np.sort(ids))
    for as_of in (D(2024, 2, 10), None):
        a = shard.search_tokens(tokenize(["bridge market"])[0], 10, as_of)
        b = loaded.search_tokens(tokenize(["bridge market"])[0], 10, as_of)
        np.testing.assert_array_equal(a[1], b[1])
        np.testing.assert_allclose(a[0], b[0])
    with pytest.raises(IndexIntegrityError, match="manifest says 99"):
        Bm25Shard.from_bytes(data, "2024-02", 99)
    with pytest.raises(IndexIntegrityError, match="not readable"):
        Bm25Shard.from_bytes(data[: len(data) // 2], "2024-02", 100)


def _snapshot(tmp_path, with_bm25: bool):
    entries = []
    for month in (1, 2):
        texts, ids = month_corpus(month, 30, seed=month)
        vectors = HashEncoder(16).encode_passages(texts)
        shard = MonthShard.build(f"2024-{month:02d}", vectors, ids)
        entries.append(write_shard(tmp_path, shard, Bm25Shard.build(shard.key, texts, ids) if with_bm25 else None))
    manifest = Manifest.new("hash-16", 16, entries)
    name, _ = write_manifest(tmp_path, manifest)
    return read_manifest(tmp_path, name)


def test_bm25_files_sit_beside_their_shards_in_the_manifest(tmp_path):
    manifest = _snapshot(tmp_path, with_bm25=True)
    for e in manifest.shards:
        assert e.bm25.file == e.file.removesuffix(".faiss") + ".bm25"  # same build id
        assert (tmp_path / e.bm25.file).is_file()
    lexical = ShardCache().open_lexical(tmp_path, manifest)
    assert lexical.ntotal == 60
    # Unreferenced BM25 files are garbage like shard files; referenced ones never are.
    stray = tmp_path / "shards" / "2024-01.deadbeef.bm25"
    stray.write_bytes(b"x")
    old = time.time() - 7200
    for p in (tmp_path / "shards").iterdir():
        os.utime(p, (old, old))
    assert garbage_files(tmp_path, [manifest]) == [str(stray.relative_to(tmp_path))]


def test_open_lexical_names_the_shards_without_bm25(tmp_path):
    manifest = _snapshot(tmp_path, with_bm25=False)
    with pytest.raises(LexicalMissingError, match=r"2024-01, 2024-02.*sqa index bm25"):
        ShardCache().open_lexical(tmp_path, manifest)


def test_bm25_file_changed_on_disk_is_refused(tmp_path):
    manifest = _snapshot(tmp_path, with_bm25=True)
    path = tmp_path / manifest.shards[0].bm25.file
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(IndexIntegrityError, match="sha256"):
        ShardCache().open_lexical(tmp_path, manifest)
