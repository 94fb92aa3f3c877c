"""Sentence selection: what a generator reads of the ranked passages."""

import datetime as dt

import pytest

from models.gemma_prompt import build_prompt, reader_context
from models.reader_base import RetrievedPassage
from models.reader_context import add_titles, clean_title, content_terms, select_context, split_passage

DAY = dt.date(2023, 6, 12)
PREFIX = "Monday, June 12, 2023. "


def passage(body: str, day: dt.date = DAY, title: str = "t") -> RetrievedPassage:
    return RetrievedPassage(title=title, text=body, published=day)


FILLER = " ".join(f"The council met on item {i} and adjourned without a vote." for i in range(12))


def test_split_passage_keeps_the_date_apart_and_splits_sentences():
    prefix, sentences = split_passage(PREFIX + 'The Heat flew home. "We lost," he said. Denver won 94-89!')
    assert prefix == PREFIX
    assert sentences == ["The Heat flew home.", '"We lost," he said.', "Denver won 94-89!"]


def test_content_terms_drop_stopwords_and_keep_numbers():
    assert content_terms("Who won the 2023 NBA championship this week?") == {"won", "2023", "nba", "championship"}


def test_a_late_answer_sentence_is_kept_where_the_first_words_lose_it():
    text = FILLER + " The Denver Nuggets won the NBA championship on Monday."
    ps = [passage(text)]
    old = reader_context("Who won the NBA championship?", ps, n_passages=3, max_passage_words=100)
    new = reader_context("Who won the NBA championship?", ps, n_passages=3, max_passage_words=100, context_words=60)
    assert "Nuggets" not in old[0].dated_text
    assert "Nuggets" in new[0].dated_text
    assert new[0].dated_text.startswith(PREFIX)  # the date stays in front
    assert len(new[0].dated_text.split()) <= 60


def test_the_budget_is_shared_and_order_and_dates_are_kept():
    day2 = dt.date(2023, 6, 10)
    ps = [
        passage(FILLER + " Nikola Jokic was named finals MVP."),
        passage(FILLER + " The Nuggets won the NBA championship in five games.", day=day2),
    ]
    out = select_context("Who won the NBA championship and who was MVP?", ps, budget_words=50, max_passages=2)
    assert sum(len(p.dated_text.split()) for p in out) <= 50
    assert [p.published for p in out] == [DAY, day2]  # ranked order, each with its own date
    assert "Jokic" in out[0].dated_text and "championship in five games" in out[1].dated_text


def test_passages_beyond_max_passages_are_never_read():
    ps = [passage("Nothing here."), passage("The Nuggets won the NBA championship.")]
    out = select_context("Who won the NBA championship?", ps, budget_words=100, max_passages=1)
    assert [p.dated_text for p in out] == [ps[0].dated_text]


def test_with_room_for_everything_passages_come_back_whole():
    ps = [passage("One fact. Another fact."), passage("A third.")]
    assert select_context("What fact?", ps, budget_words=500, max_passages=5) == ps


def test_sentences_kept_within_a_passage_stay_in_their_order():
    body = "Alpha beta gamma NBA. " + FILLER + " Delta NBA championship epsilon."
    out = select_context("NBA championship", [passage(body)], budget_words=20, max_passages=1)
    text = out[0].dated_text
    assert text.index("Alpha") < text.index("Delta")


def test_the_prompt_prints_the_selected_context_whole():
    ps = reader_context("Who won?", [passage(FILLER)], n_passages=1, max_passage_words=100, context_words=40)
    prompt = build_prompt("Who won?", DAY, ps, None)
    assert prompt.splitlines()[0] == "Passage: " + ps[0].dated_text


@pytest.mark.parametrize("budget, depth", [(0, 3), (10, 0)])
def test_bad_sizes_are_refused(budget, depth):
    with pytest.raises(ValueError, match="at least 1"):
        select_context("q", [passage("x")], budget_words=budget, max_passages=depth)


# --- headlines --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw, clean",
    [
        (
            "Meet Commander Moonikin Campos, the Artemis I mannequin | CNN",
            "Meet Commander Moonikin Campos, the Artemis I mannequin.",
        ),
        ("Trump charged with 34 felony counts - The New York Times", "Trump charged with 34 felony counts."),
        ("  Who   won the NBA title?  ", "Who won the NBA title?"),
        (
            "Dolphins - Bills: what we learned in a wild game that went to overtime",
            "Dolphins - Bills: what we learned in a wild game that went to overtime.",
        ),
        ("", ""),
    ],
)
def test_clean_title_drops_the_site_and_ends_as_a_sentence(raw, clean):
    assert clean_title(raw) == clean


def test_a_headline_stands_after_the_date_once_per_article():
    first = passage("Denver beat Miami 94-89.", title="Nuggets win first NBA title | CNN")
    second = passage("Jokic was the Finals MVP.", title="Nuggets win first NBA title | CNN")
    other = passage("Rain fell.", title="Storm hits Florida")
    out = add_titles([first, second, other])
    assert [p.dated_text for p in out] == [
        PREFIX + "Nuggets win first NBA title. Denver beat Miami 94-89.",
        PREFIX + "Jokic was the Finals MVP.",
        PREFIX + "Storm hits Florida. Rain fell.",
    ]
    assert [p.title for p in out] == [first.title, second.title, other.title]


def test_a_headline_the_passage_already_starts_with_is_not_repeated():
    p = passage("Storm hits Florida. Rain fell.", title="Storm hits Florida")
    assert add_titles([p]) == [p]
    untitled = passage("Rain fell.", title="")
    assert add_titles([untitled]) == [untitled]


def test_reader_context_adds_headlines_on_top_of_the_passage_words():
    p = passage(" ".join(f"w{i}" for i in range(50)), title="Storm hits Florida")
    plain = reader_context("Q?", [p], n_passages=1, max_passage_words=20)
    titled = reader_context("Q?", [p], n_passages=1, max_passage_words=20, titles=True)
    assert titled[0].dated_text == plain[0].dated_text.replace(PREFIX, PREFIX + "Storm hits Florida. ")
    # With sentence selection the headline is a sentence like the others: it is kept when it bears
    # on the question and the budget is small.
    long = passage(FILLER, title="Storm hits Florida with record rain")
    kept = reader_context(
        "Which state did the storm hit?", [long], n_passages=1, max_passage_words=100, context_words=20, titles=True
    )
    assert "Storm hits Florida with record rain." in kept[0].dated_text
