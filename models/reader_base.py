"""The reader interface every backend fits: the passages and answers it takes and gives (one
`RetrievedPassage` type from retrieval to the reader and the evidence check), the `Reader`
protocol, `BatchedReader` for trained models, the dated question format and the answer shortening
that generators share.

A reader sees the question, the date it is asked as of, and passages that were all published on
or before that date (the retriever guarantees it; `check_passages` re-asserts it).

`models/readers.py` re-exports these names beside its deterministic fake and `load_reader`; the
backends (gemma, fid, extractive, ranker) import them from here, so no backend imports the
module that picks backends.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from indexer.chunking import dated_text
from indexer.dates import format_long


@dataclass(frozen=True)
class RetrievedPassage:
    """A passage on the answer path: what retrieval returns (serving.retrieval), a reader reads and
    the evidence check reads (serving.answering), and what a training example holds.

    `text` is the stored body, without a date; `dated_text` is what a model reads
    ("Thursday, February 7, 2019. <body>", indexer.chunking.dated_text). The ids, url and score are
    those of the retrieval that found it (0, -1, "" and 0.0 for a passage built otherwise: a
    training example's, a benchmark's).
    """

    title: str
    text: str
    published: dt.date
    passage_id: int = 0
    faiss_id: int = -1
    article_id: int = 0
    url: str = ""
    score: float = 0.0

    @property
    def dated_text(self) -> str:
        return dated_text(self.text, self.published)


@dataclass(frozen=True)
class ReaderAnswer:
    text: str  # the short answer shown to users
    raw: str  # what the model generated before shortening
    # The reader's probability of the line it wrote (the product of its tokens' probabilities);
    # None for readers that give none. Gemma's right answers mostly come with a high one.
    confidence: float | None = None


class Reader(Protocol):
    name: str

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer: ...


Item = tuple[str, dt.date, Sequence[RetrievedPassage]]  # (question, as_of, passages)


class BatchedReader:
    """A trained reader over a loaded model: `generate` is one item of `generate_batch`, every
    item's passages are checked against its as_of, and a question without passages gets an empty
    answer without reaching the model. Subclasses implement `_read` for the items that have some."""

    def __init__(self, model, *, name: str, n_passages: int | None = None) -> None:
        self.model = model
        self.name = name
        self.n_passages = n_passages or model.config.n_passages

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer:
        return self.generate_batch([(question, as_of, passages)])[0]

    def generate_batch(self, items: Sequence[Item]) -> list[ReaderAnswer]:
        for _, as_of, passages in items:
            check_passages(as_of, passages)
        live = [i for i, (_, _, ps) in enumerate(items) if ps]
        out = [ReaderAnswer(text="", raw="") for _ in items]
        for i, answer in zip(live, self._read([items[i] for i in live])):
            out[i] = answer
        return out

    def _read(self, items: Sequence[Item]) -> list[ReaderAnswer]:
        raise NotImplementedError


def dated_question(question: str, as_of: dt.date) -> str:
    """'Today is Wednesday, May 6, 2020. <question>': the StreamingQA question format."""
    return f"Today is {format_long(as_of)}. {question.strip()}"


def check_passages(as_of: dt.date, passages: Sequence[RetrievedPassage]) -> None:
    """Internal invariant: nothing published after as_of may reach a reader."""
    late = [p for p in passages if p.published > as_of]
    assert not late, f"{len(late)} passage(s) published after {as_of} reached the reader"


_PREFIXES = re.compile(
    r"^(?:the\s+)?(?:short\s+)?(?:final\s+)?answer(?:\s+is)?\s*[:\-]?\s*|^a:\s*|^according to [^,]*,\s*",
    re.IGNORECASE,
)


_COPULA = re.compile(r"\b(?:is|are|was|were|has been|have been|will be|won|became)\s+", re.IGNORECASE)
_WORD = re.compile(r"[a-z0-9]+")


def strip_restated_question(text: str, question: str) -> str:
    """'The head coach of the Harriers is Ines Okafor' -> 'Ines Okafor' when the words before the verb
    restate the question (small generators love to do that)."""
    q_words = set(_WORD.findall(question.lower()))
    for m in _COPULA.finditer(text):
        head = _WORD.findall(text[: m.start()].lower())
        rest = text[m.end() :].strip()
        if head and rest and sum(w in q_words for w in head) >= 0.6 * len(head):
            return rest
        tail = _WORD.findall(rest.lower())
        if head and tail and sum(w in q_words for w in tail) >= 0.6 * len(tail):
            return text[: m.start()].strip()
    return text


def first_worded_line(text: str) -> str | None:
    """The first line of `text` with a letter or a digit in it (None if no line has one): a
    generator's answer. A line of bullets, dashes or quotes alone is never one."""
    return next((line.strip() for line in text.split("\n") if any(c.isalnum() for c in line)), None)


def shorten_answer(raw: str, *, question: str = "", max_words: int = 8) -> str:
    """Cut a generated answer to a short phrase: its first line with a word in it (not a lone
    bullet), no 'Answer:' preamble, no restated question, no end dot."""
    text = first_worded_line(raw) or ""
    for _ in range(2):
        text = _PREFIXES.sub("", text).strip()
    if question:
        text = strip_restated_question(text, question)
    text = text.strip(" \"'`*")
    # One sentence is enough; keep abbreviations like "U.S." intact by splitting on ". " only.
    text = re.split(r"(?<=[a-z0-9\)])\.\s", text, maxsplit=1)[0]
    text = text.rstrip(" .;,:!")
    words = text.split()
    if len(words) > max_words:
        text = " ".join(words[:max_words]).rstrip(" .;,:")
    return drop_counted_noun(text, question) if question else text


_HOW_MANY = re.compile(r"\bhow many ([a-z]+)", re.IGNORECASE)
_NUMBER_WORDS = frozenset(
    """
one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen
nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred dozen
""".split()
)
_SCALES = frozenset("hundred thousand million billion trillion".split())
# Units of time: the gold answers of RealTimeQA write "how many years" both ways ("37 years", "12").
_TIME_UNITS = frozenset("second minute hour day week month year decade century".split())


def _count_word(token: str) -> bool:
    return bool(re.fullmatch(r"[$£€]?\d[\d,.]*%?", token)) or token.lower() in _NUMBER_WORDS


def drop_counted_noun(answer: str, question: str) -> str:
    """'18,000 cows' -> '18,000' when the question asks "how many cows": a count that repeats the noun
    it counts. Over the slice's questions that ask "how many NOUN", the gold answer leaves the noun
    out for every noun but units of time (97 of 104; the 7 others are "37 years", "10 seconds"
    ...), so a unit of time is left on, and so is anything but a number, its scale and the noun.

    Example:
        >>> drop_counted_noun("2.5 million customers", "How many customers lost power?")
        '2.5 million'
    """
    m = _HOW_MANY.search(question)
    if not m:
        return answer
    noun = m.group(1).lower()
    words = answer.split()
    if len(words) < 2 or words[-1].lower() not in (noun, noun + "s", noun.removesuffix("s")):
        return answer
    if noun.removesuffix("s") in _TIME_UNITS or not _count_word(words[0]):
        return answer
    if not all(w.lower() in _SCALES for w in words[1:-1]):
        return answer
    return " ".join(words[:-1])


# The capitalised words of a date (spelled out: calendar's names follow the locale).
DATE_WORDS = frozenset(
    """
Monday Tuesday Wednesday Thursday Friday Saturday Sunday January February March April May June July August September
October November December
""".split()
)

# Capitalised words that start a sentence, date a story, give a title or credit a photo: never part
# of a name that `complete_name` puts before a bare surname ("On Tuesday Biden ..." is not "Tuesday
# Biden", "Getty Images Pelé" not a name).
_NOT_NAME = (
    frozenset(
        """
The A An In On At But And Or When After Before As If For From By With Of To That This These Those It He She They We
I His Her Their Its Our While Since So Yet Also Then Now Here There What Who Why How Where Which According Meanwhile
However Still Like Under Over About Despite During Did Does Do Is Was Were Are Has Have Had Will Would Can Could Should
Former Sen. Rep. Gov. Mr. Mrs. Ms. Dr. President Prime Minister Secretary Chief CEO Judge
Justice King Queen Prince Princess Pope General Gen. Lt. Col. Sgt. St. Coach Director Senator Governor Mayor Speaker
Leader Vice Attorney Officer Rev. Sir Dame Lord Lady Actor Actress Singer Rapper Star Chairman Chairwoman House Senate
Team Company Brand Even Get Images Photo
""".split()
    )
    | DATE_WORDS
)
_NAME_TOKEN = re.compile(r"[^\W_]+(?:['’.&-][^\W_]+)*\.?|[^\w\s]", re.UNICODE)


def _name_part(token: str) -> bool:
    """A word that can stand before a surname: capitalised, not a sentence opener, day or title, not
    a possessive ("SpaceX's") or a compound like "Wyoming-based", and no sentence's end ("Mario.")
    unless it is an initial ("E.")."""
    return (
        token[:1].isupper()
        and token not in _NOT_NAME
        and not re.search(r"['’]s$|-[a-z]", token)
        and (not token.endswith(".") or re.fullmatch(r"[A-Z]\.", token) is not None)
    )


def complete_name(answer: str, texts: Sequence[str], question: str = "") -> str:
    """A one-word proper-noun answer completed with the (at most two) name words that stand before it
    in the passages read, the form they use most: "Pratt" -> "Chris Pratt" when they say "Chris Pratt
    voices Mario ... Pratt said". A small generator often copies a later mention (the bare surname,
    "Dolphins" for "Miami Dolphins"), and an exact answer needs the name whole.

    Left as it is: an answer of several words or in lower case, a word the passages also use in lower
    case (a common noun: "Flour"), a word the passages use alone at least as often as any longer
    form, and a word whose longer form the `question` names: the question asks for something other
    than what it names ("HBO Max relaunched this week as a service called:" wants "Max", not "HBO
    Max").

    Example:
        >>> complete_name("Carlson", ["Fox News and Tucker Carlson agreed to part ways. Carlson's show ..."])
        'Tucker Carlson'
    """
    words = _NAME_TOKEN.findall(answer)
    if len(words) != 1 or not words[0][:1].isupper():
        return answer
    word = words[0]
    if any(re.search(rf"\b{re.escape(word.lower())}\b", text) for text in texts):
        return answer
    forms: dict[tuple[str, ...], int] = {}
    for text in texts:
        tokens = _NAME_TOKEN.findall(text)
        for i, token in enumerate(tokens):
            if token != word:
                continue
            j = i
            while j > max(0, i - 2) and _name_part(tokens[j - 1]) and tokens[j - 1] != word:
                j -= 1
            form = tuple(tokens[j : i + 1])
            forms[form] = forms.get(form, 0) + 1
    longer = {form: n for form, n in forms.items() if len(form) > 1}
    if not longer:
        return answer
    best = max(longer, key=lambda form: (longer[form], len(form)))
    completed = " ".join(best)
    if longer[best] < forms.get((word,), 0) or grounded(completed, question):
        return answer
    return completed


def answer_tokens(text: str) -> list[str]:
    """The lower-case words and numbers of `text`, punctuation dropped (what `grounded` compares)."""
    return re.findall(r"[a-z0-9]+", text.lower())


def grounded(answer: str, text: str) -> bool:
    """Whether `answer`'s words occur in `text` as one run (case and punctuation aside)."""
    a, t = answer_tokens(answer), answer_tokens(text)
    if not a:
        return False
    n = len(a)
    return any(t[i : i + n] == a for i in range(len(t) - n + 1) if t[i] == a[0])


def final_answer(raw: str, question: str, read: Sequence[RetrievedPassage]) -> str:
    """What a generator's first line becomes for the user: shortened (`shorten_answer`), a bare
    surname completed from the passages it read (`complete_name`). Serving and a training run's
    validation both answer through it, so a checkpoint is chosen on the answers users get."""
    return complete_name(shorten_answer(raw, question=question), [p.dated_text for p in read], question)
