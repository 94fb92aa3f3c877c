"""bench/bench_quality.py end to end on the shipped sample: the served pipeline (hash encoder,
first-entity reader, the default hybrid retriever) over one window, figures that agree with the
answers it printed, and a rerun that reuses every cached answer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from evaluation.metrics import exact_match, token_f1
from tests.conftest import load_script


def _main():
    return load_script("bench/bench_quality.py").main


@pytest.fixture
def served_env(loaded_settings, monkeypatch):
    """The environment `sqa serve` would read for the loaded home."""
    monkeypatch.setenv("SQA_HOME", str(loaded_settings.home))
    monkeypatch.setenv("SQA_DATABASE_URL", loaded_settings.db_url)
    monkeypatch.setenv("SQA_ENCODER", "hash")
    monkeypatch.setenv("SQA_READER", "first-entity")
    return loaded_settings


def test_bench_quality_on_the_sample_measures_the_served_pipeline(served_env, tmp_path, capsys):
    main = _main()
    out = tmp_path / "quality.json"
    argv = ["--home", str(served_env.home), "--windows", "2024-01-01:2024-03-31", "--baseline", "",
            "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "retriever hybrid, reader first-entity" in printed
    result = json.loads(out.read_text())
    [window] = result["windows"].values()
    assert window["n"] == 13 and result["config"]["retriever"] == "hybrid"
    recall = [window["recall"][f"@{k}"] for k in (1, 5, 10, 20, 50)]
    assert recall == sorted(recall) and 0.0 <= recall[0] and recall[-1] <= 100.0
    preds = window["predictions"]
    em = 100 * sum(exact_match(p["e2e"], p["answers"]) for p in preds.values()) / 13
    f1 = 100 * sum(token_f1(p["e2e"], p["answers"]) for p in preds.values()) / 13
    assert window["end_to_end"]["em"] == pytest.approx(em, abs=0.05)
    assert window["end_to_end"]["f1"] == pytest.approx(f1, abs=0.05)
    gold = [p for p in preds.values() if p["gold"] is not None]
    assert window["gold_passage"]["n"] == len(gold) > 0 and window["gold_passage"]["left_out"] == 13 - len(gold)
    assert window["latency_ms"]["total"]["n"] == 13
    assert window["latency_ms"]["total"]["p50_ms"] >= window["latency_ms"]["read"]["p50_ms"]

    partial = Path(f"{out}.partial.jsonl")
    lines = len(partial.read_text().splitlines())
    assert lines == 13 + len(gold)
    assert main(argv) == 0  # the rerun answers nothing again
    assert len(partial.read_text().splitlines()) == lines
    again = json.loads(out.read_text())
    assert list(again["windows"].values())[0]["predictions"] == preds


def test_bench_quality_says_when_the_home_is_empty(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SQA_DATABASE_URL", raising=False)
    assert _main()(["--home", str(tmp_path / "nothing")]) == 2
    assert "holds no database" in capsys.readouterr().err
