"""Answers kept for the same question asked again: a newsroom asks the same thing many times a day,
and an answer depends only on the question's words, its `as_of`, `top_k`, the index snapshot and
the models serving. A hit answers in well under a millisecond instead of a read of about a second,
and does not take a place at the answer gate.

The key holds everything the answer is computed from:

    (question with its whitespace collapsed, as_of, top_k, passages read, index snapshot id,
     reader name, retriever name)

- The reader's name carries its version and runtime ("gemma:<version>@llama.cpp"), the retriever's
  the re-ranker version serving (serving.reranking.RerankingRetriever.name). Activating a version,
  ingesting a month or publishing live news (every change is a new snapshot) makes new keys, so a
  stale answer is never served; old entries age out of the LRU.
- Whitespace is collapsed, nothing else: the prompt reads the question's words joined by single
  spaces and the retrievers' tokenisers skip whitespace, so such questions get the same answer.
  Case is kept (the reader reads it).
- The API and the ask page look a question up before the answer gate (`AnswerService.cached`), so
  a hit takes no place there and never enters the gate's answer times. `AnswerService.answer`
  always computes, and keeps what it computed on the serving snapshot; evaluations, benchmarks and
  the training's checks call it directly.

`SQA_ANSWER_CACHE` entries per process (0: off). Thread-safe.
"""

from __future__ import annotations

import datetime as dt
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class AnswerKey:
    question: str
    as_of: dt.date
    top_k: int
    n_read: int
    snapshot_id: str
    reader: str
    retriever: str

    @classmethod
    def of(
        cls, question: str, as_of: dt.date, top_k: int, n_read: int, snapshot_id: str, reader: str, retriever: str
    ) -> AnswerKey:
        """The key of a question; its whitespace collapsed.

        >>> AnswerKey.of("Who won  the\\nfinal? ", dt.date(2023, 6, 13), 5, 5, "s1", "r", "d").question
        'Who won the final?'
        """
        return cls(" ".join(question.split()), as_of, top_k, n_read, snapshot_id, reader, retriever)


class AnswerCache(Generic[T]):
    """The `entries` most recently used answers by key (least recently used dropped first)."""

    def __init__(self, entries: int) -> None:
        if entries < 0:
            raise ValueError(f"answer cache entries must be >= 0, got {entries}")
        self.entries = entries
        self._items: OrderedDict[AnswerKey, T] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0  # answers served from here
        self.stores = 0  # answers computed and kept: hits / (hits + stores) of the answers were served here

    def get(self, key: AnswerKey) -> T | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: AnswerKey, value: T) -> None:
        if self.entries == 0:
            return
        with self._lock:
            self.stores += 1
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.entries:
                self._items.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)


__all__ = ["AnswerCache", "AnswerKey"]
