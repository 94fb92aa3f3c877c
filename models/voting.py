"""Votes across passages: a reader's answer from its usual reading of the top passages together, and
from each of the top `depth` passages read alone, the answer whose readings weigh most winning.

A reading of the passages together can miss an answer that one passage states plainly (the prompt
is long, the passages disagree, the answer sits in the fifth); a passage read alone gives the answer
it holds, or, where it holds none, a guess the reader is seldom confident of. So each reading votes
for its answer with the reader's confidence in it (`ReaderAnswer.confidence`, the probability of the
line it wrote), the reading of the passages together with `joint_weight` times its confidence;
answers are the same vote when they are equal once normalised as EM normalises them ("The Eagles"
and "eagles"). The winner is written as its most confident reading wrote it (the joint reading's
form first), with that reading's confidence: the confidence stays the reader's own probability, so
what the trust bands say of it still holds.

Reading `depth` passages alone costs `depth` more generations of short prompts; with
SQA_READER_VOTE=0 (the default) none is made.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evaluation.metrics import normalize_answer
from models.reader_base import ReaderAnswer, RetrievedPassage

UNKNOWN_CONFIDENCE = 0.5  # a reading without a confidence (a reader that gives none) votes with this


@dataclass(frozen=True)
class Vote:
    answer: ReaderAnswer
    weight: float
    joint: bool


def tally(votes: Sequence[Vote]) -> tuple[ReaderAnswer, float] | None:
    """The winning answer and its share of all the weight (None when no vote names an answer).
    Ties go to the group the joint reading is in, then to the best-ranked reading.

    Example:
        >>> a = ReaderAnswer(text="Lionel Messi", raw="", confidence=0.4)
        >>> b = ReaderAnswer(text="messi", raw="", confidence=0.3)
        >>> c = ReaderAnswer(text="Lionel Messi", raw="", confidence=0.5)
        >>> won, share = tally([Vote(b, 0.3, True), Vote(a, 0.4, False), Vote(c, 0.5, False)])
        >>> won.text, round(share, 2)
        ('Lionel Messi', 0.75)
    """
    groups: dict[str, list[tuple[int, Vote]]] = {}
    for i, v in enumerate(votes):
        key = normalize_answer(v.answer.text)
        if key:
            groups.setdefault(key, []).append((i, v))
    if not groups:
        return None
    total = sum(v.weight for members in groups.values() for _, v in members)

    def rank(members: list[tuple[int, Vote]]) -> tuple[float, bool, int]:
        return (sum(v.weight for _, v in members), any(v.joint for _, v in members), -members[0][0])

    best = max(groups.values(), key=rank)
    # the winner's form: the joint reading's, else its most confident reading's
    _, shown = max(best, key=lambda iv: (iv[1].joint, _confidence(iv[1].answer), -iv[0]))
    weight = sum(v.weight for _, v in best)
    return shown.answer, (weight / total if total > 0 else 0.0)


def _confidence(answer: ReaderAnswer) -> float:
    c = getattr(answer, "confidence", None)
    return UNKNOWN_CONFIDENCE if c is None else float(c)


class VotingReader:
    """`reader`'s reading of its first `n_passages` together, plus each of the first `depth`
    passages read alone, tallied (`tally`). It asks for max(the reader's passages, depth)."""

    def __init__(self, reader: Any, *, depth: int, joint_weight: float = 2.0) -> None:
        if depth < 1:
            raise ValueError(f"vote depth must be at least 1, got {depth}")
        if joint_weight < 0:
            raise ValueError(f"joint_weight must be >= 0, got {joint_weight}")
        self.reader, self.depth, self.joint_weight = reader, depth, joint_weight
        self.together: int = getattr(reader, "n_passages", None) or 3
        self.n_passages = max(self.together, depth)
        self.name = f"{reader.name}+vote{depth}"

    def __getattr__(self, name: str) -> Any:  # what the reader has beside (its precision, a cache's hits)
        return getattr(self.reader, name)

    def context(self, question: str, passages: Sequence[RetrievedPassage]) -> list[RetrievedPassage]:
        """Every passage some reading reads (as the reader cuts it), in rank order, once each."""

        def cut(ps: Sequence[RetrievedPassage]) -> list[RetrievedPassage]:
            return list(self.reader.context(question, ps)) if hasattr(self.reader, "context") else list(ps)

        read = cut(passages[: self.together])
        for alone in passages[: self.depth]:
            read += cut([alone])
        seen, out = set(), []
        for p in read:
            key = (p.passage_id, p.text)
            if key not in seen:
                seen.add(key)
                out.append(p)
        return out

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer:
        joint = self.reader.generate(question, as_of, passages[: self.together])
        votes = [Vote(joint, self.joint_weight * _confidence(joint), True)]
        for p in passages[: self.depth]:
            alone = self.reader.generate(question, as_of, [p])
            votes.append(Vote(alone, _confidence(alone), False))
        won = tally(votes)
        return joint if won is None else won[0]
