"""Distinct evidence: copies of one text among the candidates collapsed into one, so that the
passages a reader reads are different stories.

The same story reaches the index more than once: one article under several URLs (`.../index.html`,
`...?cid=feed`, the bare path), a wire story printed by several outlets, a live page that repeats
its earlier updates. Among the first stage's (or the re-ranker's) candidates, a passage is a copy
of an earlier-ranked one when most of its word 5-grams (`threshold` of the shorter passage's)
occur in it: containment rather than Jaccard, because two outlets cut the same story into
passages at different places. A group of copies takes the rank and score of its best-ranked
member and shows its freshest one (the latest published on or before as_of; a tie keeps the
better-ranked), so an update wins over the story it repeats.

On the RealTimeQA slice about one question in ten has such a copy in its top 5 (the same CNN
article under two or three URLs, mostly).
"""

from __future__ import annotations

import datetime as dt
import re
import time
from dataclasses import replace
from typing import TYPE_CHECKING

from models.reader_base import RetrievedPassage

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from serving.index_state import LoadedSnapshot
    from serving.retrieval import Retriever

SHINGLE_WORDS = 5
_WORD = re.compile(r"\w+")


def shingles(text: str, n: int = SHINGLE_WORDS) -> frozenset[int]:
    """The hashes of `text`'s lower-cased word n-grams (one n-gram of all its words when shorter)."""
    words = _WORD.findall(text.lower())
    return frozenset(hash(tuple(words[i : i + n])) for i in range(max(1, len(words) - n + 1)))


def containment(a: frozenset[int], b: frozenset[int]) -> float:
    """The share of the smaller set that the other holds (0.0 when either is empty)."""
    if not a or not b:
        return 0.0
    return len(a & b) / min(len(a), len(b))


def collapse_copies(passages: list[RetrievedPassage], threshold: float) -> list[RetrievedPassage]:
    """`passages` (best first) with each group of copies made one: at its best member's rank and
    score, its freshest member's passage. `threshold` in (0, 1]: the containment that makes a copy.

    Example:
        >>> day = dt.date(2024, 3, 1)
        >>> a = RetrievedPassage("A", "the storm hit the coast on monday night", day, 1, score=0.9)
        >>> b = RetrievedPassage("B", "a different story about the election", day, 2, score=0.8)
        >>> c = RetrievedPassage("A", "the storm hit the coast on monday night", day.replace(day=2), 3, score=0.7)
        >>> [(p.passage_id, p.score) for p in collapse_copies([a, b, c], 0.6)]
        [(3, 0.9), (2, 0.8)]
    """
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold {threshold} must be in (0, 1]")
    groups: list[list[int]] = []  # indices into passages, best-ranked first
    heads: list[frozenset[int]] = []  # each group's members' shingles, the group's first member's
    for i, p in enumerate(passages):
        s = shingles(p.text)
        for g, head in enumerate(heads):
            if containment(s, head) >= threshold:
                groups[g].append(i)
                break
        else:
            groups.append([i])
            heads.append(s)
    out = []
    for members in groups:
        best = passages[members[0]]
        freshest = max(members, key=lambda i: (passages[i].published, -i))
        out.append(replace(passages[freshest], score=best.score))
    return out


class DistinctRetriever:
    """Another retriever's candidates with copies collapsed (`collapse_copies`): it asks for twice
    the passages wanted, so that what copies free is filled by the next distinct ones."""

    def __init__(self, base: Retriever, *, threshold: float) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"distinct-evidence threshold {threshold} must be in (0, 1]")
        self.base, self.threshold = base, threshold
        self.encoder = base.encoder

    @property
    def name(self) -> str:
        return f"{self.base.name}+distinct{self.threshold:g}"

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        """The base's (faiss id, score) hits: collapsing reads the passages (`retrieve`)."""
        return self.base.search(snapshot, question, as_of, k)

    def retrieve(
        self,
        session: Session,
        snapshot: LoadedSnapshot,
        question: str,
        as_of: dt.date,
        top_k: int,
        timings: dict[str, float] | None = None,
    ) -> list[RetrievedPassage]:
        found = self.base.retrieve(session, snapshot, question, as_of, 2 * top_k, timings=timings)
        t0 = time.perf_counter()
        out = collapse_copies(found, self.threshold)[:top_k]
        if timings is not None:
            timings["distinct"] = round((time.perf_counter() - t0) * 1000, 2)
        return out
