"""Self-labeled question generation with the real packaged spaCy model (the model is the point
here, so there is no fake): question forms, the rejection rules, limits, determinism, the CLI."""

from __future__ import annotations

import datetime as dt
import re

import pytest
from typer.testing import CliRunner

from app.cli import cli
from models.selflabel import RULES, ArticleText, GenerationStats, generate_questions, load_nlp
from models.selflabel.generate import _full_names
from settings import get_settings

DAY = dt.date(2023, 3, 14)

GOOD_SENTENCES = [
    "Maria Lopez was named head coach of the Denver Broncos on Monday after a two-month search.",
    "The Northwind Transit Authority opened the Harbour Line in March 2023 after six years of construction.",
    "Northwind Foods will hire 300 workers at its new plant in Seattle, the company said.",
    "The Seattle city council approved $4.5 million for the new Marsh Library on Tuesday.",
    "Microsoft announced the deal with OpenAI in January 2023.",
    "The Seattle Seahawks signed quarterback Geno Smith to a three-year contract.",
]


@pytest.fixture(scope="module")
def nlp():
    return load_nlp()


def article(*sentences: str, url: str = "https://news.example/a", day: dt.date = DAY) -> ArticleText:
    return ArticleText(url=url, title="A headline", text="\n\n".join(sentences), published=day)


def generate(nlp, *articles, **kwargs) -> tuple[list, GenerationStats]:
    stats = GenerationStats()
    return list(generate_questions(articles, nlp=nlp, stats=stats, **kwargs)), stats


@pytest.mark.integration
def test_load_nlp_is_cached_and_has_a_parser_and_ner():
    assert load_nlp() is load_nlp()
    assert {"parser", "ner"} <= set(load_nlp().pipe_names)


@pytest.mark.integration
def test_selflabel_subject_person_becomes_a_who_question(nlp):
    questions, stats = generate(nlp, article(GOOD_SENTENCES[0]))
    assert [q.answer for q in questions] == ["Maria Lopez"]
    q = questions[0]
    assert q.question == "Who was named head coach of the Denver Broncos on Monday after a two-month search?"
    assert (q.answer_label, q.published, q.url, q.title) == ("PERSON", DAY, "https://news.example/a", "A headline")
    assert q.sentence == GOOD_SENTENCES[0]
    assert stats.articles == 1 and stats.accepted == 1


@pytest.mark.integration
def test_selflabel_answers_a_surname_with_the_articles_full_name(nlp):
    # The question is made from the later sentence, which says "Lopez"; the answer is her full name.
    named = "Maria Lopez was named head coach of the Denver Broncos on Monday after a two-month search."
    later = "Team owner Greg Penner said Lopez had impressed the Denver Broncos board during interviews in February."
    questions, _ = generate(nlp, article(named, later))
    assert [(q.question, q.answer) for q in questions if q.sentence == later] == [
        ("Who had impressed the Denver Broncos board during interviews in February?", "Maria Lopez")
    ]
    # Two people of that surname: the surname stays; a longer form of one name is the same person.
    assert _full_names([nlp(named), nlp(later)]) == {"lopez": "Maria Lopez", "penner": "Greg Penner"}
    assert "lopez" not in _full_names([nlp(named), nlp("Singer Jennifer Lopez attended the game."), nlp(later)])
    assert _full_names([nlp("President Joe Biden met Joe Biden's advisers.")]) == {"biden": "Joe Biden"}


@pytest.mark.parametrize(
    "sentence, label, question, answer",
    [
        (
            "The Seattle city council approved the new budget in March 2023.",
            "DATE",
            "When did the Seattle city council approve the new budget?",
            "March 2023",
        ),
        (
            "About 300 workers will lose their jobs at the Boeing plant in Everett.",
            "CARDINAL",
            "How many workers will lose their jobs at the Boeing plant in Everett?",
            "About 300",
        ),
        (
            GOOD_SENTENCES[3],
            "MONEY",
            "How much did the Seattle city council approve for the new Marsh Library on Tuesday?",
            "$4.5 million",
        ),
    ],
)
@pytest.mark.integration
def test_selflabel_wh_word_follows_the_entity_label(nlp, sentence, label, question, answer):
    questions, _ = generate(nlp, article(sentence))
    assert [(q.question, q.answer, q.answer_label) for q in questions] == [(question, answer, label)]


@pytest.mark.integration
def test_selflabel_fronts_a_place_with_do_support_and_deduplicates(nlp):
    text = "Governor Jay Inslee opened the new Northwind Foods office in Seattle on Tuesday."
    copies = [article(text, url=f"https://news.example/{k}") for k in range(3)]
    questions, stats = generate(nlp, *copies)
    # the first copy gives one of the two forms, the second copy the other, the third only duplicates
    assert sorted((q.question, q.answer) for q in questions) == [
        ("Where did Governor Jay Inslee open the new Northwind Foods office on Tuesday?", "Seattle"),
        ("Who opened the new Northwind Foods office in Seattle on Tuesday?", "Jay Inslee"),
    ]
    assert stats.rejected["duplicate"] == 3


@pytest.mark.parametrize(
    "sentence, reason",
    [
        ("He said the Seattle Seahawks would play their home games at Lumen Field from April 2024.", "pronoun_subject"),
        (
            '"We are getting closer, but we are not there yet," Governor Jay Inslee told reporters in Olympia.',
            "direct_speech",
        ),
        ("Getty Images photo of Governor Jay Inslee at the Boeing factory in Everett last week.", "boilerplate"),
        ("Who will replace Maria Lopez as head coach of the Denver Broncos next season?", "not_a_statement"),
        ("Maria Lopez won.", "sentence_length"),
    ],
)
@pytest.mark.integration
def test_selflabel_rejects_whole_sentences_and_counts_the_reason(nlp, sentence, reason):
    questions, stats = generate(nlp, article(sentence))
    assert questions == []
    assert stats.rejected == {reason: 1}
    assert stats.sentences == 1 and stats.candidates == 0


@pytest.mark.parametrize(
    "sentence, reason, refused",
    [
        ("Governor Jay Inslee visited the Boeing factory in Everett on Wednesday.", "relative_date", "Wednesday"),
        (
            "Governor Jay Inslee opened the new Seattle Reserve Bank office in Seattle on Tuesday.",
            "answer_in_question",
            "Seattle",
        ),
    ],
)
@pytest.mark.integration
def test_selflabel_rejects_bad_answers_and_counts_the_reason(nlp, sentence, reason, refused):
    for seed in range(4):  # whichever candidate the seed picks, the refused answer never comes out
        questions, stats = generate(nlp, article(sentence), seed=seed)
        assert refused not in {q.answer for q in questions}
        assert stats.rejected.get(reason, 0) >= 1
        assert stats.candidates == stats.accepted + sum(
            n for r, n in stats.rejected.items() if RULES[r].startswith("(c)")
        )


@pytest.mark.integration
def test_selflabel_respects_max_per_article_with_one_question_per_sentence(nlp):
    many = article(*GOOD_SENTENCES)
    two, stats = generate(nlp, many, max_per_article=2)
    assert len(two) == 2
    assert len({q.sentence for q in two}) == 2
    assert stats.rejected.get("article_limit", 0) >= 1
    three, _ = generate(nlp, many)
    assert len(three) == 3 and len({q.sentence for q in three}) == 3
    with pytest.raises(ValueError, match="max_per_article must be a positive integer, not 0"):
        list(generate_questions([many], nlp=nlp, max_per_article=0))


@pytest.mark.integration
def test_selflabel_is_deterministic_for_a_seed(nlp):
    articles = [article(*GOOD_SENTENCES, url=f"https://news.example/{k}") for k in range(2)]
    first, _ = generate(nlp, *articles, seed=5)
    again, _ = generate(nlp, *articles, seed=5)
    assert first == again
    picks = {tuple(q.question for q in generate(nlp, *articles, seed=s)[0]) for s in range(6)}
    assert len(picks) > 1, "the seed should change which candidates are kept"


@pytest.mark.integration
def test_selflabel_parses_only_the_first_max_chars(nlp):
    filler = "Short line.\n" * 30
    late = article(filler + GOOD_SENTENCES[0])
    assert generate(nlp, late, max_chars=200)[0] == []
    assert [q.answer for q in generate(nlp, late)[0]] == ["Maria Lopez"]


@pytest.mark.integration
def test_selflabel_skips_articles_without_text(nlp):
    empty = ArticleText(url="https://news.example/empty", title="t", text="", published=DAY)
    questions, stats = generate(nlp, empty, article(GOOD_SENTENCES[0]), empty)
    assert [q.answer for q in questions] == ["Maria Lopez"]
    assert stats.articles == 3


# ---- the CLI, over the shipped sample loaded into a database ---------------------------------------


@pytest.fixture
def sqa(monkeypatch, loaded_settings):
    monkeypatch.setenv("SQA_HOME", str(loaded_settings.home))
    monkeypatch.setenv("SQA_DATABASE_URL", loaded_settings.database_url)
    get_settings.cache_clear()
    yield lambda *args: CliRunner().invoke(cli, list(args))
    get_settings.cache_clear()


LINE = re.compile(r"^(\d{4}-\d\d-\d\d) \| (.+\?) \| (.+) \(([A-Z_]+)\)$")


@pytest.mark.integration
def test_cli_selflabel_prints_dated_questions_and_rejections(sqa):
    r = sqa("selflabel", "--until", "2024-03-01", "--n", "5", "--seed", "1")
    assert r.exit_code == 0, r.output
    lines = [m for m in map(LINE.match, r.output.splitlines()) if m]
    assert 1 <= len(lines) <= 5
    assert all(dt.date.fromisoformat(m.group(1)) < dt.date(2024, 3, 1) for m in lines)
    assert "accepted" in r.output and "rejected" in r.output
    assert sqa("selflabel", "--until", "2024-03-01", "--n", "5", "--seed", "1").output == r.output
    month = sqa("selflabel", "--month", "2024-01", "--n", "50")
    assert month.exit_code == 0, month.output
    assert all(m.group(1).startswith("2024-01") for m in map(LINE.match, month.output.splitlines()) if m)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (("--month", "2024-13"), "month '2024-13' is not a month (use YYYY-MM)"),
        (("--month", "24-01"), "is not a month"),
        (("--until", "2024-02-30"), "--until '2024-02-30' is not a date"),
        (("--month", "2024-01", "--until", "2024-02-01"), "give at most one of --month or --until"),
    ],
)
def test_cli_selflabel_bad_input_exits_2(sqa, args, fragment):
    r = sqa("selflabel", *args)
    assert r.exit_code == 2, r.output
    assert fragment in r.output
