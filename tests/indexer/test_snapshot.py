"""Snapshots on disk: shard files, manifests, verification on open, garbage collection."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import re

import numpy as np
import pytest

from indexer.dates import day_number
from indexer.ids import make_ids
from indexer.manifest import Manifest, ShardEntry, read_manifest, write_manifest
from indexer.shards import MonthShard, ShardedIndex
from indexer.snapshot import IndexIntegrityError, ShardCache, garbage_files, write_shard

DIM = 8
ENCODER = "fake-hash-encoder-v1"
D = dt.date


def month_shard(key: str, first: dt.date, last: dt.date, n: int, seed: int) -> MonthShard:
    rng = np.random.default_rng(seed)
    days = rng.integers(day_number(first), day_number(last) + 1, size=n)
    ids = make_ids(days, rng.choice(1_000_000, size=n, replace=False))
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    return MonthShard.build(key, x / np.linalg.norm(x, axis=1, keepdims=True), ids)


@pytest.fixture
def shards():
    return [
        month_shard("history-2023-01", D(2022, 10, 1), D(2022, 12, 31), 40, 1),
        month_shard("2023-01", D(2023, 1, 1), D(2023, 1, 31), 30, 2),
        month_shard("2023-02", D(2023, 2, 1), D(2023, 2, 28), 30, 3),
    ]


@pytest.fixture
def written(tmp_path, shards):
    """(index_dir, manifest written to disk, manifest path)."""
    manifest = Manifest.new(ENCODER, DIM, [write_shard(tmp_path, s) for s in shards])
    name, _ = write_manifest(tmp_path, manifest)
    return tmp_path, manifest, tmp_path / name


def temp_files(directory):
    return [p for p in directory.rglob("*") if p.name.endswith(".tmp")]


def test_write_shard_writes_an_immutable_named_file(tmp_path, shards):
    entry = write_shard(tmp_path, shards[1])
    again = write_shard(tmp_path, shards[1])
    assert re.fullmatch(r"shards/2023-01\.[0-9a-f]{8}\.faiss", entry.file)
    assert again.file != entry.file  # a rewrite never replaces a file a snapshot may use
    assert entry.sha256 == again.sha256
    assert (entry.count, entry.dim, entry.min_day, entry.max_day) == (
        30,
        DIM,
        shards[1].min_day.isoformat(),
        shards[1].max_day.isoformat(),
    )
    assert temp_files(tmp_path) == []
    loaded = MonthShard.load(
        tmp_path / entry.file, entry.key, entry.count, DIM, min_day=shards[1].min_day, max_day=shards[1].max_day
    )
    assert np.array_equal(loaded.ids(), shards[1].ids())


def test_write_manifest_is_atomic_and_roundtrips(written):
    index_dir, manifest, path = written
    assert path == index_dir / "snapshots" / f"{manifest.snapshot_id}.json"
    assert temp_files(index_dir) == []
    assert read_manifest(path) == manifest
    again_name, sha = write_manifest(index_dir, manifest)  # idempotent
    assert index_dir / again_name == path
    assert read_manifest(index_dir, again_name) == manifest
    assert read_manifest(path, expected_sha256=sha) == manifest
    with pytest.raises(FileExistsError, match=manifest.snapshot_id):
        write_manifest(index_dir, dataclasses.replace(manifest, encoder="other"))


def test_manifest_json_roundtrip_and_fields(written):
    _, manifest, _ = written
    assert Manifest.from_json(manifest.to_json()) == manifest
    body = json.loads(manifest.to_json())
    assert body["total"] == manifest.total == 100
    assert manifest.created_at.endswith("+00:00")
    assert dt.datetime.fromisoformat(manifest.created_at).tzinfo is not None
    assert [e.key for e in manifest.shards] == ["history-2023-01", "2023-01", "2023-02"]


def test_manifest_with_shard_replaces_by_key_and_keeps_order(tmp_path, written, shards):
    _, manifest, _ = written
    march = write_shard(tmp_path, month_shard("2023-03", D(2023, 3, 1), D(2023, 3, 31), 5, 4))
    added = manifest.with_shard(march)
    assert [e.key for e in added.shards] == ["history-2023-01", "2023-01", "2023-02", "2023-03"]
    assert added.snapshot_id != manifest.snapshot_id and added.total == 105
    jan = write_shard(tmp_path, month_shard("2023-01", D(2023, 1, 2), D(2023, 1, 30), 7, 5))
    replaced = added.with_shard(jan)
    assert [e.key for e in replaced.shards] == ["history-2023-01", "2023-01", "2023-02", "2023-03"]
    assert replaced.shard("2023-01") == jan and replaced.total == 105 - 30 + 7
    assert manifest.shard("2023-01").count == 30  # the original is unchanged


def test_manifest_with_shard_merges_months_with_drop(tmp_path, written):
    _, manifest, _ = written
    merged = write_shard(tmp_path, month_shard("history-2023-02", D(2022, 10, 1), D(2023, 1, 31), 70, 6))
    with pytest.raises(ValueError, match="overlap"):
        manifest.with_shard(merged)
    compacted = manifest.with_shard(merged, drop=["history-2023-01", "2023-01"])
    assert [e.key for e in compacted.shards] == ["history-2023-02", "2023-02"]


@pytest.mark.parametrize(
    "text",
    ["", "{not json", "[]", '{"format": 1}', '{"format": 99, "shards": []}'],
)
def test_manifest_from_json_rejects_garbage(text):
    with pytest.raises(IndexIntegrityError, match="not a valid index manifest"):
        Manifest.from_json(text)


def test_manifest_from_json_rejects_wrong_total(written):
    _, manifest, _ = written
    body = json.loads(manifest.to_json())
    body["total"] += 1
    with pytest.raises(IndexIntegrityError, match="total"):
        Manifest.from_json(json.dumps(body))


def test_manifest_rejects_naive_or_non_utc_created_at():
    for created in ("2023-04-14T12:00:00", "2023-04-14T12:00:00+02:00", "yesterday"):
        with pytest.raises(ValueError, match="created_at"):
            Manifest("s1", created, ENCODER, DIM)


def test_read_manifest_missing_or_changed_raises(written):
    index_dir, manifest, path = written
    with pytest.raises(IndexIntegrityError, match="cannot be read"):
        read_manifest(index_dir / "snapshots" / "nope.json")
    with pytest.raises(IndexIntegrityError, match="the database recorded"):
        read_manifest(path, expected_sha256="0" * 64)
    path.write_text(path.read_text()[:-20])
    with pytest.raises(IndexIntegrityError, match="not a valid index manifest"):
        read_manifest(path)


def test_shard_cache_open_snapshot_searches_like_the_shards(written, shards):
    index_dir, manifest, path = written
    opened = ShardCache().open_snapshot(index_dir, read_manifest(path), expected_encoder=ENCODER, expected_dim=DIM)
    direct = ShardedIndex(shards)
    assert (opened.ntotal, opened.dim, opened.min_day, opened.max_day) == (100, DIM, direct.min_day, direct.max_day)
    q = np.random.default_rng(7).standard_normal((5, DIM)).astype(np.float32)
    for as_of in (D(2022, 11, 15), D(2023, 1, 31), D(2023, 2, 10), D(2023, 6, 1)):
        for a, b in zip(opened.search(q, as_of, 9), direct.search(q, as_of, 9)):
            assert np.array_equal(a, b)


def test_shard_cache_reuses_loaded_shards(tmp_path, written):
    index_dir, manifest, _ = written
    cache = ShardCache()
    first = cache.open_snapshot(index_dir, manifest, expected_encoder=ENCODER, expected_dim=DIM)
    march = write_shard(tmp_path, month_shard("2023-03", D(2023, 3, 1), D(2023, 3, 31), 5, 4))
    newer = manifest.with_shard(march)
    second = cache.open_snapshot(index_dir, newer, expected_encoder=ENCODER, expected_dim=DIM)
    assert all(a is b for a, b in zip(first.shards, second.shards[:3]))
    assert len(cache) == 4
    assert cache.retain(index_dir, [newer]) == 0
    assert cache.retain(index_dir, [manifest]) == 1 and len(cache) == 3


def test_open_snapshot_rejects_checksum_mismatch(written):
    index_dir, manifest, _ = written
    entry = manifest.shards[1]
    data = bytearray((index_dir / entry.file).read_bytes())
    data[len(data) // 2] ^= 0x01  # one flipped bit in a vector: only the checksum can tell
    (index_dir / entry.file).write_bytes(bytes(data))
    lo, hi = entry.span
    MonthShard.from_bytes(bytes(data), entry.key, entry.count, entry.dim, min_day=lo, max_day=hi)
    with pytest.raises(IndexIntegrityError, match="sha256") as err:
        ShardCache().open_snapshot(index_dir, manifest, expected_encoder=ENCODER, expected_dim=DIM)
    assert entry.key in str(err.value) and entry.file in str(err.value)
    assert "sqa index rebuild" in str(err.value)


def test_open_snapshot_rejects_missing_file(written):
    index_dir, manifest, _ = written
    entry = manifest.shards[2]
    (index_dir / entry.file).unlink()
    with pytest.raises(IndexIntegrityError, match=f"shard {entry.key} .* is missing") as err:
        ShardCache().open_snapshot(index_dir, manifest, expected_encoder=ENCODER, expected_dim=DIM)
    assert "sqa index rebuild" in str(err.value)


def test_open_snapshot_rejects_wrong_count(written):
    index_dir, manifest, _ = written
    entry = manifest.shards[0]
    wrong = dataclasses.replace(
        manifest, shards=(dataclasses.replace(entry, count=entry.count + 1), *manifest.shards[1:])
    )
    with pytest.raises(IndexIntegrityError, match=f"shard {entry.key} .* holds 40 vectors, the manifest says 41"):
        ShardCache().open_snapshot(index_dir, wrong, expected_encoder=ENCODER, expected_dim=DIM)


def test_open_snapshot_rejects_wrong_encoder_or_dim(written):
    index_dir, manifest, _ = written
    with pytest.raises(IndexIntegrityError, match="encoder 'fake-hash-encoder-v1'.*'other-encoder'") as err:
        ShardCache().open_snapshot(index_dir, manifest, expected_encoder="other-encoder", expected_dim=DIM)
    assert "sqa index rebuild" in str(err.value)
    with pytest.raises(IndexIntegrityError, match="dimension 8, the encoder produces 384"):
        ShardCache().open_snapshot(index_dir, manifest, expected_encoder=ENCODER, expected_dim=384)


def test_open_snapshot_rejects_a_rewritten_file_already_cached(written):
    index_dir, manifest, _ = written
    cache = ShardCache()
    cache.open_snapshot(index_dir, manifest, expected_encoder=None, expected_dim=None)
    entry = manifest.shards[0]
    other = dataclasses.replace(manifest, shards=(dataclasses.replace(entry, sha256="f" * 64), *manifest.shards[1:]))
    with pytest.raises(IndexIntegrityError, match="never be rewritten"):
        cache.open_snapshot(index_dir, other, expected_encoder=None, expected_dim=None)


def test_garbage_files_finds_unreferenced_files_only(tmp_path, written, shards):
    index_dir, old, old_path = written
    replacement = write_shard(index_dir, month_shard("2023-02", D(2023, 2, 1), D(2023, 2, 27), 6, 8))
    new = old.with_shard(replacement)
    new_path = index_dir / write_manifest(index_dir, new)[0]
    stray_tmp = index_dir / "shards" / ".2023-03.deadbeef.faiss.0badc0de.tmp"
    stray_tmp.write_bytes(b"half written")
    unrelated = index_dir / "shards" / "README.txt"
    unrelated.write_text("not ours")

    assert garbage_files(index_dir, [old, new], min_age_s=0) == [str(stray_tmp.relative_to(index_dir))]
    expected = sorted([index_dir / old.shards[2].file, old_path, stray_tmp])
    assert [index_dir / n for n in garbage_files(index_dir, [new], min_age_s=0)] == expected
    assert garbage_files(index_dir, [new]) == []  # everything is younger than the default grace period
    for p in expected:
        p.unlink()
    # what remains is exactly the new snapshot, and it still opens
    assert garbage_files(index_dir, [new], min_age_s=0) == []
    ShardCache().open_snapshot(index_dir, read_manifest(new_path), expected_encoder=ENCODER, expected_dim=DIM)
    with pytest.raises(ValueError, match="at least one manifest"):
        garbage_files(index_dir, [])


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(file="/abs/2023-01.faiss"), "relative path"),
        (dict(file="../2023-01.faiss"), "relative path"),
        (dict(sha256="abc"), "sha256"),
        (dict(count=0), "count"),
        (dict(min_day="2023-02-01"), "after max_day"),
        (dict(max_day="2023-02-30"), "not YYYY-MM-DD"),
    ],
)
def test_shard_entry_rejects_bad_fields(change, message):
    good = dict(
        key="2023-01",
        file="shards/2023-01.0a1b2c3d.faiss",
        sha256="a" * 64,
        count=3,
        min_day="2023-01-01",
        max_day="2023-01-31",
        dim=DIM,
    )
    assert ShardEntry(**good).span == (D(2023, 1, 1), D(2023, 1, 31))
    with pytest.raises(ValueError, match=message):
        ShardEntry(**(good | change))
