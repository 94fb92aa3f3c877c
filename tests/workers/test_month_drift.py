"""Drift at ingest and on demand: month profiles from the serving snapshot, rows per reference,
and an ingest that stands whatever the drift does."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
from sqlalchemy import func, select

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import drift_config, ingest_config
from evaluation.drift import load_profile
from serving import reader_registry as registry
from serving.errors import InvalidInputError
from store.tables import MonthDrift
from tests.conftest import load_sample
from workers import month_drift as drift_mod
from workers.ingest import ingest
from workers.month_drift import ProfileStore, backfill_drift, compute_month_drift, profile_month, reference_months


def rows_by_key(settings) -> dict[tuple[str, str], MonthDrift]:
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            return {(r.month, r.reference): r for r in s.scalars(select(MonthDrift))}
    finally:
        db.close()


def test_reference_months_previous_earlier_and_training():
    months = ["2023-11", "2024-01", "2024-02", "2024-03"]
    assert reference_months(months, "2024-03", "previous") == ["2024-02"]
    assert reference_months(months, "2024-01", "previous") == ["2023-11"]  # the latest ingested one
    assert reference_months(months, "2024-03", "earlier") == ["2023-11", "2024-01", "2024-02"]
    assert reference_months(months, "2023-11", "earlier") == []
    # `sqa train reader --until 2024-02-01` (exclusive) and a fine-tune on 2024-02 (its last day).
    assert reference_months(months, "2024-03", "training", dt.date(2024, 2, 1)) == ["2023-11", "2024-01"]
    assert reference_months(months, "2024-03", "training", dt.date(2024, 2, 29)) == ["2023-11", "2024-01", "2024-02"]
    assert reference_months(months, "2024-03", "training", None) == []
    with pytest.raises(InvalidInputError, match="reference 'later' is unknown"):
        reference_months(months, "2024-03", "later")


def test_ingest_hook_stores_rows_for_each_ingested_month(settings):
    job = load_sample(settings)
    assert job.state == "succeeded"
    rows = rows_by_key(settings)
    assert set(rows) == {
        ("2024-02", "previous"),
        ("2024-02", "earlier"),
        ("2024-03", "previous"),
        ("2024-03", "earlier"),
    }  # January has nothing before it and no reader is active
    march = rows[("2024-03", "earlier")]
    assert (march.reference_first, march.reference_last, march.reader_version) == ("2024-01", "2024-02", None)
    assert march.encoder == "hash-384" and march.n_target == job.counts["2024-03"]["passages"]
    assert march.n_source == rows[("2024-02", "earlier")].n_target + rows[("2024-02", "previous")].n_source
    assert set(march.measures) == {"unseen_words", "unseen_words_tokens", "cosine", "kl"}
    assert 0 < march.measures["unseen_words"] < 1 and march.measures["kl"] > 0
    assert job.counts["2024-03"]["drift"]["rows"] == 2
    profiles = settings.drift_dir / "profiles"
    assert sorted(p.name for p in profiles.iterdir()) == [
        f"2024-0{m}.{ext}" for m in (1, 2, 3) for ext in ("json.gz", "npz")
    ]


def test_ingest_hook_skips_the_history_shard_and_can_be_turned_off(make_settings):
    from indexer.importers import read_realtimeqa
    from tests.conftest import SAMPLE
    from workers.imports import store_records

    settings = make_settings()
    db = open_database(settings)
    try:
        store_records(db.sessions, *read_realtimeqa(SAMPLE)[:2])
        ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2024-03", "from": "2024-02"})
    finally:
        db.close()
    assert set(rows_by_key(settings)) == {("2024-03", "previous"), ("2024-03", "earlier")}

    off = make_settings(home=settings.home.parent / "off", drift_on_ingest=False)
    load_sample(off)
    assert rows_by_key(off) == {}


def test_ingest_succeeds_when_drift_raises(settings, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(drift_mod, "compute_month_drift", broken)
    job = load_sample(settings)
    assert job.state == "succeeded"
    assert job.counts["2024-03"]["drift"] == {"error": "RuntimeError: disk full"}
    assert rows_by_key(settings) == {}
    assert "drift of 2024-03 could not be computed" in caplog.text


def test_reingest_replaces_the_month_rows_and_rebuilds_its_profile(settings):
    load_sample(settings)
    stem = settings.drift_dir / "profiles" / "2024-03"
    before = load_profile(stem).meta["shard_file"]
    db = open_database(settings, migrate=False)
    try:
        ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"month": "2024-03"})
        with db.sessions() as s:
            assert s.scalar(select(func.count()).select_from(MonthDrift).where(MonthDrift.month == "2024-03")) == 2
    finally:
        db.close()
    assert load_profile(stem).meta["shard_file"] != before  # the new shard file's profile


def test_compute_month_drift_adds_training_rows_for_the_active_reader(settings):
    load_sample(settings)
    (settings.models_dir / "extractive-x-000001").mkdir(parents=True)
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s, s.begin():
            registry.register_version(
                s,
                version="extractive-x-000001",
                kind="extractive",
                path="extractive-x-000001",
                trained_until=dt.date(2024, 2, 1),
                activate=True,
                models_dir=settings.models_dir,
            )
        rows = compute_month_drift(db.sessions, settings.index_dir, "2024-03", drift_config(settings))
        assert [r["reference"] for r in rows] == ["previous", "earlier", "training"]
        training = rows[-1]
        assert (training["reference_first"], training["reference_last"]) == ("2024-01", "2024-01")
        assert training["reader_version"] == "extractive-x-000001"
        # January is both "previous" of February and the training set: the same measures.
        feb = {
            r["reference"]: r
            for r in compute_month_drift(db.sessions, settings.index_dir, "2024-02", drift_config(settings))
        }
        assert feb["training"]["measures"] == pytest.approx(feb["previous"]["measures"])
    finally:
        db.close()


def test_profile_month_matches_its_shard_and_passages(settings):
    load_sample(settings)
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as s:
            p = profile_month(s, settings.index_dir, "2024-02", ("words",), profiles_dir=settings.drift_dir / "p")
            store = ProfileStore(s, settings.index_dir, settings.drift_dir / "p", ("words",))
            assert store.get("2024-02").meta == p.meta  # loaded from the file just written
            np.testing.assert_allclose(store.get("2024-02").sum_vec, p.sum_vec)
            assert p.counts["words"]["february"] < p.n  # the "Friday, February 2, 2024. " prefixes are dropped
            with pytest.raises(InvalidInputError, match="month 2031-01 is not ingested"):
                profile_month(s, settings.index_dir, "2031-01", ("words",), profiles_dir=settings.drift_dir / "p")
    finally:
        db.close()


def test_backfill_drift_computes_missing_months_and_refuses_empty_ranges(make_settings):
    settings = make_settings(drift_on_ingest=False)
    load_sample(settings)
    db = open_database(settings, migrate=False)
    try:
        cfg = drift_config(settings)
        rows = backfill_drift(db.sessions, settings.index_dir, cfg, first="2024-02", last="2024-02")
        assert [(r["month"], r["reference"]) for r in rows] == [("2024-02", "previous"), ("2024-02", "earlier")]
        first = rows_by_key(settings)[("2024-02", "earlier")].computed_at
        again = backfill_drift(db.sessions, settings.index_dir, cfg)  # 2024-02 is up to date: kept
        assert len(again) == 4 and rows_by_key(settings)[("2024-02", "earlier")].computed_at == first
        backfill_drift(db.sessions, settings.index_dir, cfg, recompute=True)
        assert rows_by_key(settings)[("2024-02", "earlier")].computed_at > first
        with pytest.raises(InvalidInputError, match="no ingested month in 2031-01"):
            backfill_drift(db.sessions, settings.index_dir, cfg, first="2031-01", last="2031-01")
    finally:
        db.close()
