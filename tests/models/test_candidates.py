"""The candidate ranker: entity candidates from annotated passages, a learned choice among them."""

from __future__ import annotations

import random

import pytest

from models.candidates import CandidateRanker, MajorityAnswer, RankerItem, annotated, candidates, mean_f1, question_type

PEOPLE = ["Ada Brand", "Otto Fell", "Mira Quade", "Ivo Stern", "Lena Roth", "Pia Lund"]
PLACES = ["Kestrel Bay", "Port Calder", "Lowmoor", "Greyfen", "Marrowby", "Vandermere"]


def _item(i: int, rng: random.Random) -> RankerItem:
    person, place = rng.choice(PEOPLE), rng.choice(PLACES)
    who = i % 2 == 0
    question = f"Who opened the museum in {place}?" if who else f"Where did {person} open the museum?"
    answer = person if who else place
    decoy = rng.choice([p for p in PEOPLE if p != person])
    record = {
        "sentences": [
            ["museum", "opened", "the", *place.lower().split(), *person.lower().split()],
            ["weather", "was", "fine", *decoy.lower().split()],
        ],
        "mentions": [[decoy, "PERSON", 1], [place, "GPE", 0], [person, "PERSON", 0], ["Tuesday", "DATE", 1]],
    }
    return RankerItem(f"q{i}", question, (answer,), (annotated(record, rank=0, score=0.5, days_old=3),))


def test_question_type_finds_the_wh_word_and_head_noun():
    assert question_type("Which country hosted the summit?") == ("which", "country")
    assert question_type("How many people died?") == ("how many", "")
    assert question_type("The capital is?") == ("", "")


def test_candidates_merge_mentions_and_measure_overlap():
    item = _item(0, random.Random(1))
    found = {c.text: c for c in candidates(item)}
    assert set(found) >= {"Tuesday"} and len(found) == 4
    person = item.answers[0]
    assert found[person].overlap > found["Tuesday"].overlap


def test_ranker_learns_which_entity_type_answers_which_question():
    rng = random.Random(0)
    items = [_item(i, rng) for i in range(80)]
    train, test = items[:60], items[60:]
    ranker = CandidateRanker().fit(train)
    assert mean_f1(ranker.predict(test), test) == pytest.approx(100.0)
    assert mean_f1(MajorityAnswer().fit(train).predict(test), test) < 50.0


def test_ranker_needs_positive_and_negative_candidates_and_a_fit():
    item = RankerItem(
        "q",
        "Who?",
        ("Nobody Here",),
        (annotated({"sentences": [["x"]], "mentions": [["Ada Brand", "PERSON", 0]]}, rank=0, score=1.0, days_old=0),),
    )
    with pytest.raises(ValueError, match="match a gold answer"):
        CandidateRanker().fit([item])
    with pytest.raises(RuntimeError, match="fit"):
        CandidateRanker().predict([item])


def test_ranker_answers_empty_without_candidates():
    rng = random.Random(0)
    ranker = CandidateRanker().fit([_item(i, rng) for i in range(10)])
    assert ranker.predict([RankerItem("q", "Who?", ("x",), ())]) == [""]
