"""The feature re-ranker (models/ltr.py): its features, what it learns, and its JSON version file."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from models.ltr import FEATURES, FeatureReranker, candidate_features

QUESTION = "Which team won the NBA championship in Denver this week?"


def _cand(text, *, age=3, score=0.5, article=1, title="", hit=False):
    return {
        "input": f"{title}. {text}" if title else text,
        "title": title,
        "age": age,
        "score": score,
        "article": article,
        "hit": hit,
    }


def test_features_follow_the_question_the_rank_the_age_and_the_article():
    cands = [
        _cand("Rain is expected in Seattle on Friday.", age=1, score=0.9, article=1),
        _cand(
            "The Denver Nuggets won the NBA championship, beating the Heat.",
            age=4,
            score=0.7,
            article=2,
            title="Nuggets win NBA championship",
        ),
        _cand("More on the NBA championship parade in Denver.", age=4, score=0.6, article=2),
    ]
    x = candidate_features(QUESTION, cands)
    f = {name: x[:, i] for i, name in enumerate(FEATURES)}
    assert x.shape == (3, len(FEATURES))
    assert list(f["first_stage_score"]) == [0.9, 0.7, 0.6]
    assert f["inverse_rank"][0] == 1.0 and f["log_rank"][0] == 0.0
    assert f["age_above_newest"][0] == 0.0 and f["age_above_newest"][1] == pytest.approx(np.log1p(3))
    # the answering passage holds more of the question, its bigrams and its name, in one sentence and its title
    for name in ("question_weight", "question_share", "best_sentence_weight", "title_share", "bigrams", "names_share"):
        assert f[name][1] > f[name][0], name
    # two candidates of article 2; the second is not its article's first
    assert f["same_article"][1] == f["same_article"][2] > f["same_article"][0] == 0.0
    assert list(f["article_first"]) == [1.0, 1.0, 0.0]
    assert candidate_features(QUESTION, []).shape == (0, len(FEATURES))


def _items(n, seed):
    """Questions whose positive sits at a random place of the first stage's order, and holds the
    question's words: a model that reads the words puts it back on top."""
    rng = random.Random(seed)
    items = []
    for q in range(n):
        topic = f"Zorbex{q} Quantel{q}"
        question = f"Who leads {topic} after the vote?"
        cands = [
            _cand(
                f"Unrelated report {q}-{j} about the weather and markets.",
                age=rng.randint(0, 30),
                score=1 - j / 10,
                article=100 * q + j,
            )
            for j in range(8)
        ]
        at = rng.randrange(8)
        cands[at] = _cand(
            f"Ana Ruiz leads {topic} after the vote on Monday.",
            age=rng.randint(0, 30),
            score=1 - at / 10,
            article=100 * q + at,
            hit=True,
        )
        items.append({"query": question, "cands": cands})
    return items


def _recall_at_1(model, items):
    hits = 0
    for item in items:
        order = np.argsort(-model.score_candidates(item["query"], item["cands"]), kind="stable")
        hits += item["cands"][int(order[0])]["hit"]
    return hits / len(items)


def test_it_learns_to_put_the_answering_passage_first_and_reloads_the_same(tmp_path):
    model = FeatureReranker.fit(_items(40, seed=0))
    test = _items(30, seed=1)
    first_stage = sum(item["cands"][0]["hit"] for item in test) / len(test)
    assert first_stage < 0.3 and _recall_at_1(model, test) > 0.9
    model.save(tmp_path / "v1", {"version": "v1", "recency_weight": 0.0})
    info = json.loads((tmp_path / "v1" / "reranker.json").read_text())
    assert info["kind"] == "features" and info["model"]["features"] == list(FEATURES)
    again = FeatureReranker.load(tmp_path / "v1")
    assert again.name == "v1" and again.info["recency_weight"] == 0.0
    item = test[0]
    assert np.array_equal(
        again.score_candidates(item["query"], item["cands"]), model.score_candidates(item["query"], item["cands"])
    )


def test_it_refuses_items_it_cannot_learn_from_and_a_file_of_other_features(tmp_path):
    only_misses = [{"query": QUESTION, "cands": [_cand("Rain."), _cand("Snow.")]}]
    with pytest.raises(ValueError, match="nothing to learn"):
        FeatureReranker.fit(only_misses)
    FeatureReranker.fit(_items(10, seed=0)).save(tmp_path / "v1", {"version": "v1"})
    path = tmp_path / "v1" / "reranker.json"
    info = json.loads(path.read_text())
    info["model"]["features"] = ["first_stage_score"]
    path.write_text(json.dumps(info))
    with pytest.raises(ValueError, match="trained on other features"):
        FeatureReranker.load(tmp_path / "v1")
