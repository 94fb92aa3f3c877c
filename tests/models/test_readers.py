from __future__ import annotations

import datetime as dt

import pytest

from models.reader_base import complete_name, final_answer
from models.readers import FirstEntityReader, RetrievedPassage, dated_question, load_reader, shorten_answer

Q = "Who is the head coach of the Kestrel Bay Harriers?"


@pytest.mark.parametrize(
    "raw, question, expected",
    [
        ("Ines Okafor", Q, "Ines Okafor"),
        ("Answer: Ines Okafor.", Q, "Ines Okafor"),
        ("The answer is 4.25 percent.", "What is the rate?", "4.25 percent"),
        ("The head coach of the Kestrel Bay Harriers is Ines Okafor.", Q, "Ines Okafor"),
        ("Ines Okafor is the head coach of the Kestrel Bay Harriers.", Q, "Ines Okafor"),
        ("U.S. Senate", "Which chamber passed it?", "U.S. Senate"),
        ("Denver Nuggets\nThey beat the Heat.", "Who won?", "Denver Nuggets"),
        ("Okafor. She replaced Verhoeven in February.", Q, "Okafor"),
        ("one two three four five six seven eight nine ten", "Q?", "one two three four five six seven eight"),
        ("", Q, ""),
        ("\u2022\nInes Okafor\n", Q, "Ines Okafor"),  # a copied bullet is no answer: the first line with a word is
        ("- \n\n", Q, ""),
    ],
)
def test_shorten_answer_cuts_to_a_short_phrase(raw, question, expected):
    assert shorten_answer(raw, question=question) == expected


@pytest.mark.parametrize(
    "answer, question, expected",
    [
        ("18,000 cows", "How many cows died in an explosion at a dairy farm in Texas?", "18,000"),
        ("2.5 million customers", "How many customers lost power?", "2.5 million"),  # a scale stays
        ("Four times", "How many times did he win it?", "Four"),  # a number word, a singular noun
        ("5 cow", "How many cows were rescued?", "5"),
        ("37 years", "How many years did she serve?", "37 years"),  # a unit of time: gold writes it both ways
        ("Many cows", "How many cows died?", "Many cows"),  # no number: left alone
        ("18,000 dairy cows", "How many cows died?", "18,000 dairy cows"),  # more than number and noun
        ("18,000 cows", "What died in the fire?", "18,000 cows"),  # no "how many": left alone
    ],
)
def test_a_count_drops_the_noun_the_question_counts(answer, question, expected):
    assert shorten_answer(answer, question=question) == expected


OKAFOR = "Ines Okafor took over the Kestrel Bay Harriers. On Sunday Okafor won."


@pytest.mark.parametrize(
    "answer, texts, expected",
    [
        ("Okafor", [OKAFOR], "Ines Okafor"),  # the first mention's full name
        ("Carroll", ["E. Jean Carroll testified. Carroll said so."], "E. Jean Carroll"),  # an initial is a name part
        ("Okafor", ["On Sunday Okafor won. Okafor said."], "Okafor"),  # a day and a sentence's first word are not
        ("Starship", ["SpaceX's Starship exploded. Starship flew."], "Starship"),  # nor a possessive
        ("Okafor", ["Coach Okafor won."], "Okafor"),  # nor a title
        ("Max", ["Max launched. HBO Max is now Max. Max costs more."], "Max"),  # the bare word is the more common form
        ("Flour", ["Gold Medal Flour was recalled: the flour may hold salmonella."], "Flour"),  # a common noun
        ("Ines Okafor", [OKAFOR], "Ines Okafor"),  # several words: left alone
        ("Okafor", ["Verhoeven resigned."], "Okafor"),  # not in the passages: left alone
        ("", [OKAFOR], ""),
    ],
)
def test_complete_name_adds_the_first_names_the_passages_give(answer, texts, expected):
    assert complete_name(answer, texts) == expected


@pytest.mark.parametrize(
    "question, expected",
    [
        ("HBO Max relaunched this week as a service called:", "Max"),  # the longer form is what the question names
        ("Two services, HBO Max and Discovery+, are merging. What will the service be called?", "Max"),
        ("Which streaming service raised its prices?", "HBO Max"),  # not named: completed as before
        ("Is HBO going to stream it?", "HBO Max"),  # a part of the longer form is not the form
    ],
)
def test_complete_name_leaves_a_word_whose_longer_form_the_question_names(question, expected):
    texts = ["HBO Max is now Max. HBO Max costs more."]
    assert complete_name("Max", texts, question) == expected


def test_final_answer_shortens_then_completes_from_the_passages_read():
    read = [RetrievedPassage("t", OKAFOR, dt.date(2024, 3, 7))]
    assert final_answer("Answer: Okafor.\nShe won.", Q, read) == "Ines Okafor"
    assert final_answer("Answer: Okafor.", Q, []) == "Okafor"


def test_dated_question_uses_the_streamingqa_format():
    assert dated_question(" Who won? ", dt.date(2020, 5, 6)) == "Today is Wednesday, May 6, 2020. Who won?"


def test_first_entity_reader_copies_an_entity_the_question_lacks():
    p = RetrievedPassage("t", "The Harriers won under Ines Okafor on Sunday.", dt.date(2024, 3, 7))
    assert FirstEntityReader().generate("Who coaches the Harriers?", dt.date(2024, 3, 8), [p]).text == "Ines Okafor"
    assert FirstEntityReader().generate("Who?", dt.date(2024, 3, 8), []).text == ""


def test_reader_refuses_a_passage_after_as_of():
    p = RetrievedPassage("t", "Late news.", dt.date(2024, 3, 7))
    with pytest.raises(AssertionError, match="published after 2024-03-06"):
        FirstEntityReader().generate("Who?", dt.date(2024, 3, 6), [p])


def test_load_reader_rejects_unknown_backends():
    with pytest.raises(ValueError, match="reader 'gpt-9' is unknown"):
        load_reader("gpt-9")
