"""Answer forms learned from past questions (models/answer_forms.py)."""

from __future__ import annotations

import datetime as dt

import pytest

from models.answer_forms import AnswerForms, FormedReader, form_key
from models.reader_base import ReaderAnswer, RetrievedPassage

DAY = dt.date(2023, 3, 1)
FORMS = ["Joe Biden", "Joe Biden", "Kamala Harris", "Artemis 1", "New York City", "New York Rangers", "Ukraine"]


def test_a_bare_run_grows_to_the_known_form_the_passages_state():
    forms = AnswerForms(FORMS)
    assert forms.refine("Biden", ["President Joe Biden met ..."]) == "Joe Biden"
    assert forms.refine("Artemis", ["NASA's Artemis 1 mission lifted off"]) == "Artemis 1"
    # The passages never state the longer form: the answer stays.
    assert forms.refine("Biden", ["Biden said on Monday ..."]) == "Biden"


def test_a_known_form_a_tie_and_the_question_leave_the_answer_alone():
    forms = AnswerForms(FORMS)
    assert forms.refine("Ukraine", ["Ukraine's army ..."]) == "Ukraine"
    assert forms.refine("the ukraine", ["..."]) == "the ukraine"  # known once normalised as EM does
    # "New York" lies in two forms seen once each, both stated: no way to choose, so it stays.
    both = ["New York City police said the New York Rangers ..."]
    assert forms.refine("New York", both) == "New York"
    # The question names the longer form: it asks for something else.
    assert forms.refine("Biden", ["Joe Biden ..."], question="Who did Joe Biden meet in Kyiv?") == "Biden"


def test_contract_cuts_an_answer_to_the_longest_form_seen_twice():
    text = ["President Joe Biden said ..."]
    assert AnswerForms(FORMS, mode="expand").refine("President Joe Biden", text) == "President Joe Biden"
    assert AnswerForms(FORMS, mode="contract").refine("President Joe Biden", text) == "Joe Biden"
    # "Artemis 1" was seen once: too rare to cut to.
    assert AnswerForms(FORMS, mode="contract").refine("the Artemis 1 rocket", text) == "the Artemis 1 rocket"
    assert AnswerForms(FORMS, mode="off").refine("Biden", ["Joe Biden"]) == "Biden"


def test_forms_keep_their_most_written_spelling_and_skip_sentences():
    sentence = "The answer is a sentence of many more words than any quiz writes as a form"
    forms = AnswerForms(["New York City", "new york city", "New York City", sentence])
    assert forms.written[form_key("NEW YORK CITY")] == "New York City"
    assert len(forms) == 1
    with pytest.raises(ValueError, match="answer forms mode 'both' is unknown"):
        AnswerForms(FORMS, mode="both")


class _Scripted:
    name = "scripted"
    n_passages = 2

    def __init__(self, text: str) -> None:
        self.text = text

    def context(self, question, passages):
        return list(passages[:1])  # reads only the first passage

    def generate(self, question, as_of, passages):
        return ReaderAnswer(self.text, raw=self.text, confidence=0.4)


def test_the_formed_reader_refines_against_what_its_reader_read():
    passages = [
        RetrievedPassage("", "Biden spoke.", DAY),
        RetrievedPassage("", "Kamala Harris and Joe Biden ...", DAY),
    ]
    formed = FormedReader(_Scripted("Biden"), AnswerForms(FORMS))
    # The second passage states "Joe Biden", but the reader cuts its context to the first.
    assert formed.generate("Who spoke?", DAY, passages).text == "Biden"
    formed = FormedReader(_Scripted("Biden"), AnswerForms(FORMS))
    out = formed.generate("Who spoke?", DAY, passages[::-1])
    assert (out.text, out.raw, out.confidence) == ("Joe Biden", "Biden", 0.4)
    assert formed.name == "scripted+forms-expand" and formed.n_passages == 2
