"""Answer forms learned from past questions: an answer rewritten in the form the quizzes use.

A reader copies a span from what it reads, and the span is often a little off the form a quiz writes:
"Biden" where every quiz writes "Joe Biden", "Artemis" for "Artemis 1". The gold answers and the
choices (the distractors too: they are written in the same house style) of the questions asked before
a cut are the forms; `AnswerForms.refine` moves an answer that is not one of them to one that is:

- **expand**: the answer is a run of words inside a longer known form that the passages read also
  state ("Biden" -> "Joe Biden" where a passage says "Joe Biden"); the most frequent such form wins,
  and a tie, or a form the question itself names (it asks for something else), leaves the answer.
- **contract** (the second mode): the answer holds a known form inside it with words around it
  ("President Joe Biden" -> "Joe Biden"); the longest such form seen at least twice wins.

An answer that is already a known form is left as it is. Forms are compared as EM compares answers
(`evaluation.metrics.normalize_answer`: case, punctuation and articles aside). Serving builds the
forms from the questions asked before the serving reader's training cut (`serving.answer_forms`), so
an evaluated question never teaches its own form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import Any

from evaluation.metrics import answer_in_haystack, haystack, normalize_answer

MODES = ("off", "expand", "contract")
MAX_WORDS = 8  # longer choices are sentences, not forms


def form_key(text: str) -> tuple[str, ...]:
    """An answer's words as EM compares them."""
    return tuple(normalize_answer(text).split())


def _runs(words: tuple[str, ...]) -> Iterable[tuple[str, ...]]:
    """Every shorter contiguous run of `words`."""
    n = len(words)
    for size in range(1, n):
        for i in range(n - size + 1):
            yield words[i : i + size]


class AnswerForms:
    """The known answer forms (and how often each was written), and the rewrite to them."""

    def __init__(self, forms: Iterable[str], *, mode: str = "expand", min_contract: int = 2) -> None:
        if mode not in MODES:
            raise ValueError(f"answer forms mode {mode!r} is unknown (expected one of {MODES})")
        self.mode, self.min_contract = mode, min_contract
        self.counts: Counter[tuple[str, ...]] = Counter()
        written: dict[tuple[str, ...], Counter[str]] = {}
        for text in forms:
            key = form_key(text)
            if key and len(key) <= MAX_WORDS:
                self.counts[key] += 1
                written.setdefault(key, Counter())[text.strip()] += 1
        self.written = {key: spellings.most_common(1)[0][0] for key, spellings in written.items()}
        self.longer: dict[tuple[str, ...], list[tuple[str, ...]]] = {}  # a run -> the forms holding it
        for key in self.counts:
            for run in set(_runs(key)):
                self.longer.setdefault(run, []).append(key)

    def __len__(self) -> int:
        return len(self.counts)

    def refine(self, answer: str, texts: Sequence[str], question: str = "") -> str:
        """`answer` in a known form (see the module), or as it is.

        Example:
            >>> forms = AnswerForms(["Joe Biden", "Joe Biden", "Kamala Harris", "Biden administration"])
            >>> forms.refine("Biden", ["President Joe Biden said on Monday ..."])
            'Joe Biden'
        """
        key = form_key(answer)
        if self.mode == "off" or not key or key in self.counts:
            return answer
        stated = []
        longer = self.longer.get(key, ())
        if longer:  # the passages are normalised only for an answer some known form holds
            read, asked = [haystack(t) for t in texts], haystack(question)
            for form in longer:
                needle = " ".join(form)
                if any(answer_in_haystack(needle, h) for h in read) and not answer_in_haystack(needle, asked):
                    stated.append(form)
        if stated:
            best = max(self.counts[f] for f in stated)
            top = [f for f in stated if self.counts[f] == best]
            return self.written[top[0]] if len(top) == 1 else answer
        if self.mode == "contract" and len(key) > 1:
            inside = [r for r in set(_runs(key)) if self.counts.get(r, 0) >= self.min_contract]
            if inside:
                best_run = max(inside, key=lambda r: (len(r), self.counts[r]))
                if sum(1 for r in inside if len(r) == len(best_run)) == 1:
                    return self.written[best_run]
        return answer


class FormedReader:
    """`reader`, its answers refined by `forms` against the passages it read."""

    def __init__(self, reader: Any, forms: AnswerForms) -> None:
        self.reader, self.forms = reader, forms
        self.name = f"{reader.name}+forms-{forms.mode}"

    def __getattr__(self, name: str) -> Any:  # what the reader has beside (n_passages, context, precision)
        return getattr(self.reader, name)

    def _refined(self, reading: Any, question: str, passages: Sequence[Any]) -> Any:
        read = self.reader.context(question, passages) if hasattr(self.reader, "context") else passages
        text = self.forms.refine(reading.text, [p.dated_text for p in read], question)
        return reading if text == reading.text else replace(reading, text=text)

    def generate(self, question: str, as_of: Any, passages: Sequence[Any]) -> Any:
        return self._refined(self.reader.generate(question, as_of, passages), question, passages)
