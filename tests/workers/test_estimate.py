"""`sqa estimate`: split strategies on the shipped sample, the item cache, and clear errors."""

from __future__ import annotations

import json

import pytest

from workers.estimate import EstimateConfig, parse_pool


def test_parse_pool_accepts_lists_and_ranges():
    assert parse_pool("2022Q4, 2022Q3") == ("2022Q3", "2022Q4")
    assert parse_pool("2022Q3..2023Q1") == ("2022Q3", "2022Q4", "2023Q1")
    with pytest.raises(ValueError, match="not a quarter"):
        parse_pool("2022-07")


def test_estimate_config_refuses_a_new_sample_inside_the_pool_and_unknown_strategies():
    with pytest.raises(ValueError, match="must come after"):
        EstimateConfig(pool=("2022Q3", "2022Q4"), new="2022Q4")
    with pytest.raises(ValueError, match="unknown split"):
        EstimateConfig(pool=("2022Q3",), new="2022Q4", strategies=("shuffle",))
    with pytest.raises(ValueError, match="k must be"):
        EstimateConfig(pool=("2022Q3",), new="2022Q4", k=1)


def test_cli_estimate_errors_exit_non_zero(sqa):
    r = sqa("estimate", "--pool", "2024Q1", "--new", "2023Q4")
    assert r.exit_code == 2 and "must come after" in r.output
    r = sqa("estimate", "--pool", "2024Q1", "--split", "shuffle")
    assert r.exit_code == 2 and "unknown split" in r.output
    r = sqa("estimate", "--pool", "2019Q1", "--split", "random")
    assert r.exit_code == 2 and "usable questions" in r.output


@pytest.mark.integration
def test_cli_estimate_on_the_sample_prints_the_table_and_reuses_its_cache(sqa, sample_root, tmp_path, monkeypatch):
    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-03").exit_code == 0
    out = tmp_path / "estimate.json"
    args = (
        "estimate",
        "--pool",
        "2024Q1",
        "--split",
        "random,length,adversarial",
        "--k",
        "2",
        "--test-fraction",
        "0.3",
        "--passages",
        "4",
        "--out",
        str(out),
    )
    r = sqa(*args)
    assert r.exit_code == 0, r.output
    result = json.loads(out.read_text())
    assert [row["strategy"] for row in result["table"]] == ["random", "length", "adversarial"]
    assert result["counts"]["pool"] >= 10
    assert len(result["splits"]) == 5  # 2 random + 1 length + 2 adversarial
    assert all(0.0 <= s["score"] <= 100.0 for s in result["splits"])
    assert "adversarial" in r.output and "err.red" in r.output
    caches = list((tmp_path / "home" / "work" / "estimate").glob("items-*.jsonl"))
    assert len(caches) == 1

    import models.selflabel

    def no_spacy():
        raise AssertionError("the second run must reuse the cached annotations")

    monkeypatch.setattr(models.selflabel, "load_nlp", no_spacy)
    again = sqa(*args)
    assert again.exit_code == 0, again.output
    assert json.loads(out.read_text())["table"] == result["table"]


def test_the_item_cache_is_kept_apart_per_retriever(make_settings):
    from app.bootstrap import retriever_key
    from workers.ranker_items import cache_path as cache_for

    def cache_path(settings, snapshot_id, passages):  # as a job's context derives it from the settings
        return cache_for(settings.work_dir, retriever_key(settings), snapshot_id, passages)

    paths = {
        cache_path(make_settings(retriever=r, fusion=f), "snap-1", 10)
        for r, f in [("dense", "rrf"), ("bm25", "rrf"), ("hybrid", "rrf"), ("hybrid", "weighted")]
    }
    assert len(paths) == 4  # passages found by one retriever never stand in for another's
    assert cache_path(make_settings(retriever="dense"), "snap-1", 10) == cache_path(
        make_settings(retriever="dense", fusion="weighted"), "snap-1", 10
    )  # fusion matters only to hybrid
