"""The prompt of the Gemma readers: what the generator reads of the ranked passages and how it is
written, for serving (`models.gemma.GemmaReader`) and training (`models.gemma_train`) alike.

The prompt is the one the team measured (EM 15.0 / F1 19.9 zero-shot on 80 unseen questions):

    Passage: Thursday, February 7, 2019. <at most max_words words>
    Passage: ...
    Question (asked on Friday, February 8, 2019): <question>
    Short answer:

A training example is that prompt followed by the target " <answer>\\n" (`build_example`);
`fit_prompt` cuts the passages of a prompt to a token budget.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import replace

from indexer.dates import format_long
from models.reader_base import RetrievedPassage, answer_tokens
from models.reader_context import add_titles, select_context


def build_prompt(question: str, as_of: dt.date, passages: Sequence[RetrievedPassage], max_words: int | None) -> str:
    """The team's zero-shot prompt: one line per passage (in the order given, date prefix kept, cut
    to `max_words` words counting the prefix; None: not cut), the question dated by `as_of`, then
    "Short answer:".

    Example (two passages, as_of 2023-06-13):
        Passage: Monday, June 12, 2023. The Denver Nuggets beat the Miami Heat 94-89 ...
        Passage: Sunday, June 11, 2023. ...
        Question (asked on Tuesday, June 13, 2023): Who won the NBA championship?
        Short answer:
    """
    lines = [
        f"Passage: {' '.join(p.dated_text.split()[:max_words])}" for p in passages
    ]  # [:None] keeps all  # split() also drops newlines
    lines.append(f"Question (asked on {format_long(as_of)}): {' '.join(question.split())}")
    lines.append("Short answer:")
    return "\n".join(lines)


def cut_passage(passage: RetrievedPassage, max_words: int) -> RetrievedPassage:
    """`passage` with its dated text cut to its first `max_words` words, the date's words counted:
    the body keeps what is left after the date. The date itself is never cut (with `max_words`
    under its 4 words, the passage is its date alone)."""
    keep = max(0, max_words - len(format_long(passage.published).split()))
    return replace(passage, text=" ".join(passage.text.split()[:keep]))


def echoes_question(answer: str, question: str) -> bool:
    """Whether the answer is made only of words of the question ("Latvia" for "Which country will send
    troops to Latvia?"). Such answers are mostly wrong: 5 of 23 were right on 2023-04..06."""
    words = answer_tokens(answer)
    return bool(words) and set(words) <= set(answer_tokens(question))


def reader_context(
    question: str,
    passages: Sequence[RetrievedPassage],
    *,
    n_passages: int,
    max_passage_words: int,
    context_words: int = 0,
    titles: bool = False,
) -> list[RetrievedPassage]:
    """What the generator reads of the ranked `passages`, as passages that `build_prompt(..., None)`
    prints whole: with `context_words` 0, the first `max_passage_words` words of the first
    `n_passages` (the original prompt); otherwise the sentences of the first `n_passages` that bear
    on the question, `context_words` words in all (models.reader_context.select_context). With `titles`,
    each article's headline stands after a passage's date (models.reader_context.add_titles): on top of
    the `max_passage_words` (the passage's own words are the same), or as a sentence that competes
    for the `context_words`."""
    passages = list(passages)[:n_passages]
    if context_words:
        return select_context(
            question, add_titles(passages) if titles else passages, budget_words=context_words, max_passages=n_passages
        )
    cut = [cut_passage(p, max_passage_words) for p in passages]
    return add_titles(cut) if titles else cut


def build_example(
    question: str, as_of: dt.date, passages: Sequence[RetrievedPassage], answer: str, max_words: int
) -> tuple[str, str]:
    """(prompt, target) for fine-tuning: the target is what the reader should generate after the
    prompt, " <answer>\\n", so that a trained model also stops at the newline."""
    return build_prompt(question, as_of, passages, max_words), build_target(answer)


def build_target(answer: str) -> str:
    """The training target alone: " <answer>\\n" (the reader's newline stop ends it)."""
    return f" {answer.strip()}\n"


def fit_prompt(
    question: str,
    as_of,
    passages: Sequence[RetrievedPassage],
    max_words: int,
    budget: int,
    count: Callable[[str], int],
    *,
    context_words: int = 0,
    titles: bool = False,
) -> str:
    """`build_prompt` with every passage cut to the same number of words, the most (up to `max_words`)
    that keeps `count(prompt) <= budget`; the question is never cut (without room, passages keep one
    word). `count` is the tokenizer's length of a prompt. With `context_words`, the sentences are
    selected again with a smaller word budget instead (`reader_context`), so that what is cut is
    what matters least. With `titles`, the passages carry their headlines as served (`reader_context`:
    the cut applies to the passage's own words)."""
    if context_words:
        words = context_words
        while True:
            kept = reader_context(
                question,
                passages,
                n_passages=len(passages),
                max_passage_words=max_words,
                context_words=words,
                titles=titles,
            )
            prompt = build_prompt(question, as_of, kept, None)
            n = count(prompt)
            if n <= budget or words <= 8:
                return prompt
            words = max(8, min(words - 8, int(words * budget / n)))

    def render(words: int, passages=passages) -> str:
        if not titles:  # what reader_context's cut prints, and under the date's 4 words it cuts into the date
            return build_prompt(question, as_of, passages, words)
        return build_prompt(
            question,
            as_of,
            reader_context(question, passages, n_passages=len(passages), max_passage_words=words, titles=titles),
            None,
        )

    words = min(max_words, max((len(p.dated_text.split()) for p in passages), default=1))
    prompt = render(words)
    n = count(prompt)
    if n <= budget or not passages:
        return prompt
    fixed = count(render(words, []))  # the question part, never cut
    while n > budget and words > 1:
        # Scale the passages' share to the room left; at least one word less each round.
        words = max(1, min(words - 1, int(words * max(budget - fixed, 0) / max(n - fixed, 1))))
        prompt = render(words)
        n = count(prompt)
    return prompt
