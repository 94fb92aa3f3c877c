"""bench/bench_reconcile.py: the learned pick between proposed answers, and a run on the shipped sample."""

from __future__ import annotations

import json

import pytest

from bench import bench_reconcile
from evaluation.metrics import exact_match


def _record(qid: str, gold: str, gens: list[str], lp_own: list[float]) -> dict:
    """Window j wrote gens[j] and gives it lp_own[j]; every other window gives it -5."""
    lp = {str(w): {g: (lp_own[j] if j == w else -5.0) for j, g in enumerate(gens)} for w in range(len(gens))}
    return {"qid": qid, "answers": [gold], "gens": gens, "cands": [], "lp": lp}


def test_learned_pick_finds_the_rule_its_training_window_follows():
    """In both windows the right answer is the one its own window is surest of, whichever window
    wrote it: learned on one, the pick beats the served answer (window 1) on the other."""

    def window(prefix: str, n: int) -> list[dict]:
        out = []
        for i in range(n):
            right_first = i % 3 == 0
            gens = [
                f"{prefix} right {i}" if right_first else f"{prefix} wrong {i}",
                f"{prefix} wrong {i}b" if right_first else f"{prefix} right {i}",
                "",
            ]
            out.append(
                _record(
                    f"{prefix}{i}", f"{prefix} right {i}", gens, [-0.2, -1.5, -9] if right_first else [-1.5, -0.2, -9]
                )
            )
        return out

    train, test = window("a", 30), window("b", 30)
    picked = bench_reconcile.pick_learned(train, test, with_candidates=False)
    served = [r["gens"][0] for r in test]
    assert sum(exact_match(p, r["answers"]) for p, r in zip(picked, test)) == 30
    assert sum(exact_match(s, r["answers"]) for s, r in zip(served, test)) == 10


def test_answer_rows_merge_an_answer_two_windows_wrote_and_keep_candidates_apart():
    r = _record("q", "Denver", ["Denver", "denver.", "Miami"], [-0.1, -0.3, -2.0])
    r["cands"] = [{"text": "Nikola Jokic", "feat": {"type=PERSON": 1.0}}, {"text": "Denver", "feat": {"type=GPE": 1.0}}]
    rows = dict(bench_reconcile.answer_rows(r, with_candidates=True))
    assert list(rows) == ["Denver", "Miami", "Nikola Jokic"]  # "denver." is Denver, normalised
    assert rows["Denver"]["agree"] == 2.0 and rows["Denver"]["window=1"] == 1.0 and rows["Denver"]["entity"] == 1.0
    assert rows["Denver"]["e:type=GPE"] == 1.0 and rows["Nikola Jokic"]["window=0"] == 1.0
    assert list(dict(bench_reconcile.answer_rows(r, with_candidates=False))) == ["Denver", "Miami"]


def test_bench_reconcile_on_the_sample_runs_the_served_pipeline_and_resumes(
    loaded_settings, monkeypatch, tmp_path, capsys
):
    monkeypatch.setenv("SQA_HOME", str(loaded_settings.home))
    monkeypatch.setenv("SQA_DATABASE_URL", loaded_settings.db_url)
    monkeypatch.setenv("SQA_ENCODER", "hash")
    monkeypatch.setenv("SQA_READER", "first-entity")
    out = tmp_path / "reconcile.json"
    argv = [
        "--home",
        str(loaded_settings.home),
        "--windows",
        "2024-01-01:2024-01-31,2024-02-01:2024-03-31",
        "--out",
        str(out),
    ]
    assert bench_reconcile.main(argv) == 0
    printed = capsys.readouterr().out
    assert "reader first-entity" in printed
    result = json.loads(out.read_text())
    records = [json.loads(line) for line in (tmp_path / "reconcile.json.partial.jsonl").read_text().splitlines()]
    assert len(records) == 13 and all(len(r["gens"]) == 3 for r in records)
    for rows in result["windows"].values():
        served, oracle = rows["served answer (window 1)"], rows["oracle: best of windows and candidates"]
        assert oracle[0] >= rows["oracle: best window"][0] >= served[0]
    assert bench_reconcile.main(argv) == 0  # a rerun reuses every record
    assert len((tmp_path / "reconcile.json.partial.jsonl").read_text().splitlines()) == 13


def test_bench_reconcile_wants_two_windows(loaded_settings):
    with pytest.raises(SystemExit):
        bench_reconcile.main(["--home", str(loaded_settings.home), "--windows", "2024-01-01:2024-03-31"])
