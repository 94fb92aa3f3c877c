"""bench/bench_ceiling.py: where the answers are, on the shipped sample through the served pipeline
(hash encoder, first-entity reader, hybrid retriever), with figures that must bound each other."""

from __future__ import annotations

import datetime as dt
import json
from types import SimpleNamespace

import pytest

from bench import bench_ceiling
from models.reader_base import RetrievedPassage


def test_first_hit_skips_the_date_prefix_and_counts_from_one():
    day = dt.date(2023, 6, 12)
    passages = [
        RetrievedPassage("", "The Heat flew home.", day),
        RetrievedPassage("", "The Denver Nuggets won.", day),
    ]
    assert bench_ceiling.first_hit(["Denver Nuggets"], passages) == 2
    assert bench_ceiling.first_hit(["Monday"], passages) is None  # only in the date every passage starts with


def test_anywhere_tells_apart_an_old_mention_a_recent_one_and_one_after_the_question():
    q = SimpleNamespace(answers=("Denver",), asked=dt.date(2023, 6, 13))
    old = [(dt.date(2023, 1, 2), " denver wins "), (dt.date(2023, 6, 20), " denver again ")]
    assert bench_ceiling.anywhere(old, q, 7) == (True, False)  # the June 20 one is after the question
    assert bench_ceiling.anywhere(old + [(dt.date(2023, 6, 10), " in denver ")], q, 7) == (True, True)
    assert bench_ceiling.anywhere([(dt.date(2023, 6, 10), " denverite ")], q, 7) == (False, False)


def test_feedback_terms_are_new_frequent_content_words():
    day = dt.date(2023, 6, 12)
    top = [RetrievedPassage("", "Jokic led Denver. Jokic scored 28 as the Nuggets won.", day)]
    terms = bench_ceiling.feedback_terms("Who won the NBA championship with Denver?", top, n=3)
    assert terms[0] == "jokic" and "denver" not in terms and "the" not in terms and "monday" not in terms


def test_bench_ceiling_on_the_sample_bounds_hold(loaded_settings, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("SQA_HOME", str(loaded_settings.home))
    monkeypatch.setenv("SQA_DATABASE_URL", loaded_settings.db_url)
    monkeypatch.setenv("SQA_ENCODER", "hash")
    monkeypatch.setenv("SQA_READER", "first-entity")
    out = tmp_path / "ceiling.json"
    assert (
        bench_ceiling.main(
            [
                "--home",
                str(loaded_settings.home),
                "--windows",
                "2024-01-01:2024-03-31",
                "--deep",
                "60",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "retriever hybrid, reader first-entity" in printed and "where an answer string is" in printed
    [m] = json.loads(out.read_text())["windows"].values()
    assert m["n"] == 13
    for name, r in m["recall"].items():
        values = [r[f"@{k}"] for k in (1, 5, 10, 20, 50)]
        assert values == sorted(values), name
    stored = m["answer_is"]["in a stored passage by the question date"]
    assert stored >= m["answer_is"]["in one published within 7 days before it"]
    deep = m["deep"]
    assert stored >= deep["union @60"] >= max(deep["BM25 @60"], deep["dense @60"])
    assert deep["BM25 @60"] >= m["recall"]["BM25"]["@50"] and deep["dense @60"] >= m["recall"]["dense"]["@50"]
    assert stored >= max(r["@50"] for r in m["recall"].values())
    assert m["recall"]["served"]["@50"] > 0  # the sample's answers are in its news
    ctx = m["contexts"]
    served = ctx["served: top 3 as read"]
    assert served["words"] > 0
    assert ctx["whole articles of the top 3"]["answer"] >= ctx["top 3 whole"]["answer"]  # a superset of text
    assert ctx["sentences of the top 3's articles, 1x words"]["words"] <= served["words"]  # within the budget


def test_bench_ceiling_refuses_a_shallow_deep_row(loaded_settings):
    with pytest.raises(SystemExit):
        bench_ceiling.main(["--home", str(loaded_settings.home), "--deep", "20"])
