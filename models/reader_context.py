"""What a generator reads: the sentences of the top passages that bear on the question.

The served prompt used to hold the first 100 words of the top 3 passages. Passages are up to 180
words (indexer.chunking), so an answer late in a passage was cut away, and the 4th-10th passages,
which hold the answer for another ~10% of questions, were never read. `select_context` instead
keeps, from the first `max_passages` passages, the sentences that share the most rare question
words, within one word budget for the whole prompt, and hands them back as passages (each body
its kept sentences in their original order, passages in their ranked order; the date prefix of
their dated text counted in the budget), so the prompt format does not change.

A sentence's score is the sum over the question's content words it contains of that word's
rarity among the candidate sentences (log(N / df)), plus a small bonus for the passage's rank;
a passage's first sentence after the date is its lead (often the headline fact) and gets a
bonus too. Greedy selection by score until the budget is spent.

Example (question "Who won the NBA championship?"):
    dated texts  "Monday, June 12, 2023. The Heat flew home. The Denver Nuggets won the NBA championship."
    selected     "Monday, June 12, 2023. The Denver Nuggets won the NBA championship."
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from evaluation.metrics import SENTENCE_END
from models.reader_base import RetrievedPassage

# The date prefix every passage starts with: "Thursday, February 7, 2019. "
_DATE_PREFIX = re.compile(
    r"^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), [A-Z][a-z]+ \d{1,2}, \d{4}\. "
)
_WORD = re.compile(r"[A-Za-z0-9]+(?:['’][A-Za-z]+)?")
STOPWORDS = frozenset(
    """
a an the and or but if of to in on at by for with from as into about over after before between
under than then so such that this these those there here is are was were be been being am do does
did done has have had having it its it's he she they them his her their our we you your i me my
who whom whose what which when where why how whats whos wheres week weeks this past last recent
recently according new news report reported reports said says say according not no yes will would
can could should may might must one also more most other which while during up down out off
""".split()
)
RANK_BONUS = 0.15  # per place above the last passage, in units of one rare word's weight (~log 2)
LEAD_BONUS = 0.5  # a passage's first sentence


def content_terms(text: str) -> set[str]:
    """Lower-cased words of `text` that are not stopwords (numbers kept)."""
    return {w for w in (m.group(0).lower().replace("’", "'") for m in _WORD.finditer(text)) if w not in STOPWORDS}


def split_passage(text: str) -> tuple[str, list[str]]:
    """(date prefix, sentences) of a passage's text; the prefix is "" when the text has none."""
    text = " ".join(text.split())
    m = _DATE_PREFIX.match(text)
    prefix = m.group(0) if m else ""
    body = text[len(prefix) :]
    return prefix, [s for s in SENTENCE_END.split(body) if s.strip()]


# A site's name after a headline: "Meet Commander Moonikin Campos | CNN", "... - The New York Times".
_SITE_SUFFIX = re.compile(r"\s+(?:\||-|–|—)\s+[^|]{1,40}$")


def clean_title(title: str) -> str:
    """A headline as a sentence: whitespace normalised, a trailing " | Site" (or " - Site", at most
    five words) dropped, a full stop added when it ends without one. "" stays ""."""
    title = " ".join(title.split())
    m = _SITE_SUFFIX.search(title)
    if m and len(m.group(0).split()) <= 6 and m.start() > 0:
        title = title[: m.start()].rstrip()
    if title and title[-1] not in ".?!":
        title += "."
    return title


def add_titles(passages: Sequence[RetrievedPassage]) -> list[RetrievedPassage]:
    """The passages with their article's headline (`clean_title`) as the first sentence of their body
    (after the date prefix of their dated text): a headline often states the fact a question asks
    for ("Trump charged with 34 felony counts") when the passage's sentences do not. A headline is
    given once, to the first passage with it (passages of one article share it), and not at all when
    the passage already starts with it.

    Example: title "Nuggets win first NBA title | CNN",
        text  "Denver beat Miami 94-89."
        ->    "Nuggets win first NBA title. Denver beat Miami 94-89."
    """
    seen: set[str] = set()
    out = []
    for p in passages:
        title = clean_title(p.title)
        key = title.lower()
        body = " ".join(p.text.split())
        if not title or key in seen or body.lower().startswith(key.rstrip(".?!")):
            seen.add(key)
            out.append(p)
            continue
        seen.add(key)
        out.append(replace(p, text=f"{title} {body}".rstrip()))
    return out


def select_context(
    question: str, passages: Sequence[RetrievedPassage], *, budget_words: int, max_passages: int
) -> list[RetrievedPassage]:
    """The first `max_passages` passages cut down to their sentences that matter most for
    `question`, all of them together within `budget_words` words (date prefixes counted). Passages
    left with no sentence are dropped; order and dates are kept. With room for everything, the
    passages come back whole."""
    if budget_words < 1 or max_passages < 1:
        raise ValueError(f"budget_words and max_passages must be at least 1, got {budget_words} and {max_passages}")
    passages = list(passages)[:max_passages]
    split = [split_passage(p.dated_text) for p in passages]
    total = sum(len(prefix.split()) + sum(len(s.split()) for s in sents) for prefix, sents in split)
    if total <= budget_words:
        return passages
    asked = content_terms(question)
    sentence_terms = [[content_terms(s) for s in sents] for _, sents in split]
    df = Counter(t for terms in sentence_terms for ts in terms for t in ts & asked)
    n = sum(len(terms) for terms in sentence_terms) or 1
    scored = []  # (score, passage rank, sentence position)
    for rank, terms in enumerate(sentence_terms):
        for pos, ts in enumerate(terms):
            score = sum(math.log(1 + n / df[t]) for t in ts & asked)
            score += RANK_BONUS * (len(passages) - rank) + (LEAD_BONUS if pos == 0 else 0.0)
            scored.append((score, rank, pos))
    scored.sort(key=lambda s: (-s[0], s[1], s[2]))
    kept: dict[int, set[int]] = {}
    used = 0
    for _, rank, pos in scored:
        cost = len(split[rank][1][pos].split()) + (0 if rank in kept else len(split[rank][0].split()))
        if used + cost > budget_words:
            continue  # a shorter sentence further down may still fit
        kept.setdefault(rank, set()).add(pos)
        used += cost
    out = []
    for rank in sorted(kept):
        sents = split[rank][1]
        out.append(replace(passages[rank], text=" ".join(sents[i] for i in sorted(kept[rank]))))
    return out


__all__ = ["add_titles", "clean_title", "content_terms", "select_context", "split_passage", "STOPWORDS"]
