"""The re-ranker export's format and `python -m models.train_exported_reranker`'s refusals (no model
is loaded here; tests/workers/test_train_reranker.py trains from a real export)."""

from __future__ import annotations

import json

import pytest

from models.train_exported_reranker import EXPORT_FILE, main, read_export, write_export


def _cand(text: str, hit: bool, age: int = 3, score: float = 0.5) -> dict:
    return {"input": text, "hit": hit, "age": age, "score": score, "title": "t", "article": 1}


ITEMS = {
    "train": [
        {
            "query": "q1",
            "asked": "2023-02-01",
            "source": "gold",
            "cands": [_cand("a", True), _cand("b", True), _cand("c", True), _cand("d", False), _cand("e", False)],
        },
        {"query": "q2", "asked": "2023-02-02", "source": "self", "cands": [_cand("a", True)]},  # no negative
        {"query": "q3", "asked": "2023-02-03", "source": "self", "cands": [_cand("d", False)]},  # no positive
    ],
    "val": [{"query": "v1", "asked": "2023-03-01", "source": "gold", "cands": [_cand("d", False), _cand("f", False)]}],
}


def test_an_export_keeps_what_training_can_use_and_every_held_back_candidate(tmp_path):
    info = write_export(tmp_path / "x", ITEMS, {"trained_until": "2023-04-01"}, max_positives=2, negatives=2)
    assert (info["train_questions"], info["val_questions"]) == (1, 1)
    assert info["passages"] == 5  # a, b (c is a third positive), d, e; f (d, held back too, is stored once)
    job, train, val = read_export(tmp_path / "x")
    assert job["trained_until"] == "2023-04-01" and json.loads((tmp_path / "x" / EXPORT_FILE).read_text()) == job
    [q1] = train
    assert [c["input"] for c in q1["cands"]][:2] == ["a", "b"] and [c["hit"] for c in q1["cands"]] == [
        True,
        True,
        False,
        False,
    ]
    assert [c["input"] for c in val[0]["cands"]] == ["d", "f"] and val[0]["cands"][0]["age"] == 3


def test_a_folder_without_the_job_file_is_no_export(tmp_path):
    write_export(tmp_path / "x", ITEMS, {}, max_positives=2, negatives=1)
    (tmp_path / "x" / EXPORT_FILE).unlink()  # what an interrupted export leaves
    with pytest.raises(ValueError, match="not an exported re-ranker training set"):
        read_export(tmp_path / "x")


def test_the_command_refuses_bad_input_with_a_message(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere"), "--out", str(tmp_path / "v")]) == 2
    assert "not an exported re-ranker training set" in capsys.readouterr().err
    write_export(tmp_path / "x", ITEMS, {}, max_positives=2, negatives=1)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "f").write_text("keep me")
    assert main([str(tmp_path / "x"), "--out", str(tmp_path / "taken")]) == 2
    assert "not empty" in capsys.readouterr().err and (tmp_path / "taken" / "f").read_text() == "keep me"
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "x"), "--out", str(tmp_path / "v"), "--epochs", "0"])
    assert exc.value.code == 2 and "--epochs must be >= 1" in capsys.readouterr().err


def test_training_on_one_source_only_refuses_an_export_without_its_questions(tmp_path, capsys):
    write_export(tmp_path / "x", ITEMS, {}, max_positives=2, negatives=1)  # one usable question, a gold one
    assert main([str(tmp_path / "x"), "--out", str(tmp_path / "v"), "--source", "self"]) == 2
    assert "no training groups" in capsys.readouterr().err and not (tmp_path / "v").exists()


def test_a_version_whose_gain_the_fitted_prior_makes_alone_is_not_worth_serving():
    from models.reranker import prior_alone, ranking_figures, worth_serving

    # the first stage ranks five old misses above the fresh answer
    items = [
        {
            "cands": [{"hit": False, "age": 300, "score": 0.9 - i / 10} for i in range(5)]
            + [{"hit": True, "age": 1, "score": 0.3}]
        }
    ]
    first = ranking_figures(items, None)
    useless = [[0.0] * 6]  # a model that tells the candidates apart no better than chance
    figures = ranking_figures(items, useless, recency=1.0)
    assert figures["recall@5"] == 100.0 > first["recall@5"] == 0.0  # the recency prior alone wins here
    assert not worth_serving(figures, first, prior_alone(items, 1.0, 0.0))
    helpful = ranking_figures(items, [[0.0] * 5 + [5.0]])
    assert worth_serving(helpful, first, prior_alone(items, 0.0, 0.0))
