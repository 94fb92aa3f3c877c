"""SQuAD normalisation, EM/F1 on hand-computed cases, answer recall, passage age."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from evaluation.metrics import (
    answer_in_evidence,
    answer_in_text,
    answer_support,
    days_between,
    exact_match,
    normalize_answer,
    token_f1,
)


def test_normalize_answer_removes_curly_quotes_like_ascii_ones():
    assert normalize_answer("“The Eiffel Tower’s”") == "eiffel towers"
    assert normalize_answer('"The Eiffel Tower\'s"') == "eiffel towers"
    assert normalize_answer("‘single’ «guillemets» ellipsis…") == "single guillemets ellipsis"


def test_normalize_answer_drops_dashes_articles_and_extra_space():
    assert normalize_answer("An  apple — the\tbest ") == "apple best"
    assert normalize_answer("2020–2021") == normalize_answer("2020-2021") == "20202021"
    # Articles only as whole words: "another" and "theme" stay.
    assert normalize_answer("another theme") == "another theme"


def test_exact_match_numbers_with_thousands_separator():
    assert exact_match("1,200", ["1200"]) == 1.0
    assert exact_match("1 200", ["1200"]) == 0.0  # a space separator is a second token
    assert exact_match("$5", ["5"]) == exact_match("€5", ["5"]) == 1.0
    assert exact_match("five", ["5"]) == 0.0


def test_exact_match_best_over_references():
    assert exact_match("Paris", ["London", "paris."]) == 1.0
    assert exact_match("Paris, France", ["Paris"]) == 0.0


def test_token_f1_hand_computed_values():
    # pred {red, cat, sat} vs gold {red, cat}: P = 2/3, R = 1, F1 = 0.8
    assert token_f1("red cat sat", ["the red cat"]) == pytest.approx(0.8)
    # pred {new, york, city} vs gold {york, new, jersey}: P = R = 2/3
    assert token_f1("New York City", ["York, New Jersey"]) == pytest.approx(2 / 3)
    # repeated tokens count once each: pred [cat, cat], gold [cat]: P = 1/2, R = 1
    assert token_f1("the cat cat", ["cat"]) == pytest.approx(2 / 3)
    assert token_f1("dog", ["cat"]) == 0.0


def test_token_f1_best_over_references():
    assert token_f1("red cat sat", ["blue dog", "red cat sat"]) == 1.0
    assert token_f1("red cat sat", "the red cat") == pytest.approx(0.8)  # a single string


def test_token_f1_empty_prediction_and_empty_references():
    assert token_f1("", ["Paris"]) == 0.0
    assert exact_match("", ["Paris"]) == 0.0
    # SQuAD: F1 is 1.0 only when both sides are empty after normalisation.
    assert token_f1("", [""]) == 1.0
    assert token_f1("The", ["a"]) == 1.0  # both normalise to ""
    assert token_f1("Paris", [""]) == 0.0
    assert exact_match("", []) == 1.0  # no reference: a no-answer question
    # An empty reference beside a real one is ignored, as in the SQuAD v2 script.
    assert token_f1("", ["", "Paris"]) == 0.0


def test_answer_in_text_matches_whole_token_spans_only():
    assert answer_in_text(["Joe Biden"], "On Monday, JOE BIDEN said…")
    assert not answer_in_text(["car"], "the carpet was red")
    assert not answer_in_text(["New York"], "flights to new-york")  # hyphen deleted: "newyork"
    assert answer_in_text(["nothing here", "1,200"], "about 1200 people")
    assert not answer_in_text(["", "the"], "the cat")  # empty references never match


def test_answer_support_lists_the_texts_that_state_the_answer():
    texts = ["The Denver Nuggets won the title.", "Miami lost in five.", "NUGGETS: Denver's first!", "denver-nuggets"]
    assert answer_support("Denver Nuggets", texts) == [0]  # "Denver's" and "denver-nuggets" are other tokens
    assert answer_support("the Nuggets", texts) == [0, 2]  # normalised: articles, case, punctuation
    assert answer_support("Boston", texts) == []
    assert answer_support("", texts) == answer_support(" the ", texts) == []  # nothing to state
    assert answer_support("Miami", iter(texts)) == [1]  # any iterable


def test_answer_in_evidence_needs_the_answer_beside_the_questions_words():
    q = "How many astronauts will fly around the Moon on the Artemis II mission?"
    beside = "NASA named the crew on Monday. The 4 astronauts of Artemis II will fly around the Moon."
    apart = "Artemis II astronauts will fly around the Moon next year. The rocket has 4 engines and costs a lot."
    assert answer_in_text("4", apart)  # the number is there...
    assert not answer_in_evidence("4", q, apart)  # ...but in a sentence about something else
    assert answer_in_evidence(["four", "4"], q, beside)
    assert not answer_in_evidence("4", q, beside, min_shared=6)  # astronauts artemis fly around moon: 5 shared
    assert answer_in_evidence("4", "Who?", "He scored 4.")  # no content word to share: the answer alone


def test_days_between_signs_and_input_forms():
    asked = date(2022, 3, 10)
    published = [date(2022, 3, 1), datetime(2022, 3, 10, 23, 0, tzinfo=UTC), "2022-03-12"]
    assert days_between(asked, published) == [9, 0, -2]
    assert days_between("2022-03-10", []) == []


def test_days_between_refuses_naive_datetimes_and_bad_strings():
    with pytest.raises(ValueError, match="naive"):
        days_between(datetime(2022, 3, 10), [date(2022, 3, 1)])
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        days_between(date(2022, 3, 10), ["2022-02-30"])
