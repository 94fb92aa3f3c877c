"""The reader interface every backend fits: the passages and answers it takes and gives, the
`Reader` protocol, `BatchedReader` for trained models, the dated question format and the answer
shortening that generators share.

A reader sees the question, the date it is asked as of, and passages that were all published on
or before that date (the retriever guarantees it; `check_passages` re-asserts it).

`models/readers.py` re-exports these names beside its deterministic fake and `load_reader`; the
backends (gemma, fid, extractive, ranker) import them from here, so no backend imports the
module that picks backends.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Protocol, Sequence

from indexer.dates import format_long


@dataclass(frozen=True)
class ReaderPassage:
    title: str
    text: str  # already carries its date prefix ("Thursday, February 7, 2019. ...")
    published: dt.date


@dataclass(frozen=True)
class ReaderAnswer:
    text: str  # the short answer shown to users
    raw: str  # what the model generated before shortening


class Reader(Protocol):
    name: str

    def generate(self, question: str, as_of: dt.date, passages: Sequence[ReaderPassage]) -> ReaderAnswer: ...


Item = tuple[str, dt.date, Sequence[ReaderPassage]]  # (question, as_of, passages)


class BatchedReader:
    """A trained reader over a loaded model: `generate` is one item of `generate_batch`, every
    item's passages are checked against its as_of, and a question without passages gets an empty
    answer without reaching the model. Subclasses implement `_read` for the items that have some."""

    def __init__(self, model, *, name: str, n_passages: int | None = None) -> None:
        self.model = model
        self.name = name
        self.n_passages = n_passages or model.config.n_passages

    def generate(self, question: str, as_of: dt.date, passages: Sequence[ReaderPassage]) -> ReaderAnswer:
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


def check_passages(as_of: dt.date, passages: Sequence[ReaderPassage]) -> None:
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
        head = _WORD.findall(text[:m.start()].lower())
        rest = text[m.end():].strip()
        if head and rest and sum(w in q_words for w in head) >= 0.6 * len(head):
            return rest
        tail = _WORD.findall(rest.lower())
        if head and tail and sum(w in q_words for w in tail) >= 0.6 * len(tail):
            return text[:m.start()].strip()
    return text


def shorten_answer(raw: str, *, question: str = "", max_words: int = 8) -> str:
    """Cut a generated answer to a short phrase: first line, no 'Answer:' preamble, no restated
    question, no end dot."""
    text = raw.strip().split("\n", 1)[0].strip()
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
    return text
