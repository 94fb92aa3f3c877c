"""The index's storage interface: the index code runs on any `IndexStore`, not only on a folder.

`DictStore` below is a second implementation with no file system behind it (as an object store
would be); writing, opening, searching and garbage-collecting a snapshot through it must give
what the folder gives."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest

from indexer.dates import day_number
from indexer.ids import make_ids
from indexer.index_errors import IndexIntegrityError
from indexer.lexical import Bm25Shard
from indexer.manifest import Manifest, read_manifest, write_manifest
from indexer.shards import MonthShard
from indexer.snapshot import ShardCache, garbage_files, write_shard
from indexer.storage import IndexStore, LocalStore, StoredFile, as_store, check_name
from models.encoders import HashEncoder

DIM = 16


class DictStore:
    """An in-memory store: names to bytes, with a clock for ages."""

    def __init__(self):
        self.files: dict[str, tuple[bytes, float]] = {}
        self.now = 0.0

    def read(self, name: str) -> bytes:
        if name not in self.files:
            raise FileNotFoundError(2, "No such object", name)
        return self.files[name][0]

    def write(self, name: str, data) -> None:
        self.files[check_name(name)] = (bytes(data), self.now)

    def exists(self, name: str) -> bool:
        return name in self.files

    def list(self, prefix: str) -> list[StoredFile]:
        return [StoredFile(n, self.now - t) for n, (_, t) in sorted(self.files.items()) if n.startswith(prefix)]

    def delete(self, name: str) -> None:
        self.files.pop(name, None)

    def locate(self, name: str) -> str:
        return f"mem://index/{name}"


def month_corpus(month: int, n: int, seed: int) -> tuple[list[str], np.ndarray]:
    """n dated passages of 2024-<month> with two random topic words each."""
    words = ["harbour", "council", "budget", "storm", "election", "festival", "bridge", "school"]
    rng = np.random.default_rng(seed)
    days = rng.integers(day_number(dt.date(2024, month, 1)), day_number(dt.date(2024, month, 28)) + 1, size=n)
    texts = [f"news about the {words[a]} and the {words[b]}" for a, b in rng.integers(0, len(words), (n, 2))]
    return texts, make_ids(days, rng.permutation(1000)[:n] + 1000 * month)


def _snapshot(where, months=(1, 2)):
    entries = []
    for month in months:
        texts, ids = month_corpus(month, 30, seed=month)
        shard = MonthShard.build(f"2024-{month:02d}", HashEncoder(DIM).encode_passages(texts), ids)
        entries.append(write_shard(where, shard, Bm25Shard.build(shard.key, texts, ids), encoder="hash-16"))
    manifest = Manifest.new("hash-16", DIM, entries)
    name, sha = write_manifest(where, manifest)
    return manifest, name, sha


def test_a_snapshot_through_a_store_without_files_searches_like_one_in_a_folder(tmp_path):
    store = DictStore()
    assert isinstance(store, IndexStore) and as_store(store) is store
    manifest, name, sha = _snapshot(store)
    folder_manifest, folder_name, _ = _snapshot(tmp_path)
    assert sorted(store.files) == sorted(
        [e.file for e in manifest.shards] + [e.bm25.file for e in manifest.shards] + [name]
    )
    assert read_manifest(store, name, expected_sha256=sha) == manifest

    dense = ShardCache().open_snapshot(store, manifest, expected_encoder="hash-16", expected_dim=DIM)
    dense_folder = ShardCache().open_snapshot(tmp_path, folder_manifest, expected_encoder="hash-16", expected_dim=DIM)
    q = HashEncoder(DIM).encode_passages(["the budget and the storm"])
    as_of = dt.date(2024, 2, 15)
    got, want = dense.search(q, as_of, 5), dense_folder.search(q, as_of, 5)
    assert np.array_equal(got[1], want[1]) and np.allclose(got[0], want[0])
    lexical = ShardCache().open_lexical(store, manifest)
    assert lexical.ntotal == 60


def test_a_changed_or_missing_object_is_refused_with_its_location():
    store = DictStore()
    manifest, _, _ = _snapshot(store)
    entry = manifest.shards[0]
    store.files[entry.file] = (store.files[entry.file][0][:-8], 0.0)
    with pytest.raises(IndexIntegrityError, match=r"mem://index/shards/2024-01\..*sha256"):
        ShardCache().open_snapshot(store, manifest, expected_encoder=None, expected_dim=None)
    store.delete(entry.file)
    with pytest.raises(IndexIntegrityError, match="is missing"):
        ShardCache().open_snapshot(store, manifest, expected_encoder=None, expected_dim=None)


def test_garbage_collection_through_a_store_keeps_what_a_kept_snapshot_names():
    store = DictStore()
    old, old_name, _ = _snapshot(store, months=(1,))
    store.now = 10.0
    new, new_name, _ = _snapshot(store, months=(1, 2))
    assert garbage_files(store, [old, new], min_age_s=0) == []
    assert garbage_files(store, [new], min_age_s=60) == []  # too young yet
    store.now = 100.0
    gone = garbage_files(store, [new], min_age_s=60)
    assert gone == sorted([old.shards[0].file, old.shards[0].bm25.file, old_name])
    for n in gone:
        store.delete(n)
    assert (
        ShardCache()
        .open_snapshot(store, read_manifest(store, new_name), expected_encoder=None, expected_dim=None)
        .ntotal
        == 60
    )


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../outside", "shards/../../x", "shards\\x"])
def test_store_names_stay_under_the_root(tmp_path, bad):
    with pytest.raises(ValueError, match="relative paths under the index root"):
        LocalStore(tmp_path).read(bad)


def test_local_store_lists_by_prefix_with_ages(tmp_path):
    store = LocalStore(tmp_path)
    store.write("shards/a.faiss", b"1")
    store.write("shards/b.bm25", b"22")
    store.write("snapshots/s.json", b"{}")
    assert [f.name for f in store.list("shards/")] == ["shards/a.faiss", "shards/b.bm25"]
    assert [f.name for f in store.list("shards/b")] == ["shards/b.bm25"]
    assert store.list("missing/") == []
    assert all(0 <= f.age_s < 60 for f in store.list("snapshots/"))
    assert store.read("shards/b.bm25") == b"22" and (tmp_path / "shards" / "b.bm25").read_bytes() == b"22"
    store.delete("shards/a.faiss")
    store.delete("shards/a.faiss")  # already gone: no error
    assert not store.exists("shards/a.faiss")
