"""Concurrent questions read in one model call: a small batch window in front of the reader.

A generative reader spends most of an answer's decoding steps reading its weights from memory, one
token at a time; eight prompts decoded together read them once a step for all eight. So when
several answers are in flight at once (SQA_ANSWER_CONCURRENCY above 1), their readings meet here:

- the first reading to arrive while the reader is idle leads: it waits a moment for the questions
  already admitted and still retrieving (each holds an `arrival()` until its reading is added to
  the waiting ones, in the same step), at most `window_s`, then takes up to
  `max_batch` waiting readings of the same reader into one `generate_batch` call;
- readings that arrive while a batch runs wait for it, and the next of them to wake leads the next
  batch with every reading that has gathered meanwhile (waiting, as any leader, only for questions
  still retrieving);
- one client alone never waits: nothing else is arriving, so its reading starts at once.

The prompt itself is not cheaper in a batch: on 2 cores, where a trained reader's short answer is
mostly its prompt, four clients batched answered only 1.07x one client's questions a second
(docs/experiments/2026-12-07-batched-reading.md). Hence off by default (SQA_READER_BATCH=1).

Only a reader whose `batches()` says so is batched (models.gemma.GemmaReader with greedy decoding);
any other reads one question at a time, in arrival order, as before. A batch that raises raises in
every reading it held. Each batch's size and the time its readings waited for it go to
`on_batch` (/metrics: app.api.operator_metrics).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.reader_base import ReaderAnswer, RetrievedPassage

log = logging.getLogger(__name__)


class Arrival:
    """A question on its way to the reader (`ReaderBatcher.arrival`): a leader waits for it. It ends
    when the question's first reading joins the waiting ones (in the same step, so a leader never
    sees it neither arriving nor waiting), or when `end()` is called (the question read nothing)."""

    def __init__(self, batcher: ReaderBatcher) -> None:
        self._batcher = batcher
        self._open = True

    def end(self) -> None:
        with self._batcher._cond:
            self._end_locked()
            self._batcher._cond.notify_all()

    def _end_locked(self) -> None:
        if self._open:
            self._open = False
            self._batcher._arriving -= 1

    def __enter__(self) -> Arrival:
        return self

    def __exit__(self, *exc: object) -> None:
        self.end()


@dataclass
class _Reading:
    reader: Any
    item: tuple[str, dt.date, Sequence[RetrievedPassage]]
    arrived: float = field(default_factory=time.monotonic)
    answer: ReaderAnswer | None = None
    error: BaseException | None = None
    done: bool = False


def batches(reader: Any) -> bool:
    """Whether `reader` reads several questions in one call (it says so through `batches()`)."""
    check = getattr(reader, "batches", None)
    return bool(callable(check) and check() and hasattr(reader, "generate_batch"))


class ReaderBatcher:
    """Gathers concurrent `generate` calls on the same reader into `generate_batch` calls (thread-safe).

    A question admitted and still retrieving holds an `arrival()` (AnswerService takes one per
    question); a leader waits for those at most `window_s`. `on_batch(size, waits_s)` is told of each batch as it
    starts (its readings' seconds from arrival to start); it may be set after construction.

    Example:
        >>> batcher = ReaderBatcher(max_batch=8, window_s=0.02)
        >>> # in each request's thread: batcher.generate(reader, question, as_of, passages)
    """

    def __init__(
        self,
        *,
        max_batch: int = 8,
        window_s: float = 0.02,
        on_batch: Callable[[int, list[float]], None] | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if window_s < 0:
            raise ValueError(f"window_s must be 0 or more, got {window_s}")
        self.max_batch = max_batch
        self.window_s = window_s
        self._cond = threading.Condition()
        self._arriving = 0  # open arrivals
        self._local = threading.local()  # the arrival of the question this thread answers
        self._waiting: list[_Reading] = []
        self._running = False
        self.on_batch = on_batch

    def arrival(self) -> Arrival:
        """Count this thread's question as on its way to the reader until its first reading joins
        the waiting ones (or the arrival ends: use it as a context manager)."""
        arrival = Arrival(self)
        with self._cond:
            self._arriving += 1
        self._local.arrival = arrival
        return arrival

    def generate(
        self, reader: Any, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]
    ) -> ReaderAnswer:
        """`reader.generate(question, as_of, passages)`, read in a batch with whatever else is waiting."""
        mine = _Reading(reader, (question, as_of, passages))
        with self._cond:
            arrival = getattr(self._local, "arrival", None)
            if arrival is not None:  # this question's first reading: it has arrived
                arrival._end_locked()
                self._local.arrival = None
            self._waiting.append(mine)
            self._cond.notify_all()
            while not mine.done:
                if self._running:
                    self._cond.wait()
                    continue
                self._running = True
                batch = self._gather()
                self._cond.release()
                try:
                    self._tell(batch)
                    self._read(batch)
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._cond.notify_all()
        if mine.error is not None:
            raise mine.error
        assert mine.answer is not None
        return mine.answer

    def _gather(self) -> list[_Reading]:
        """The next batch, taken out of the waiting list (called holding the lock, which the window's
        wait releases). It is led by the oldest waiting reading; a reader that does not batch goes
        alone."""
        first = self._waiting[0]
        if batches(first.reader):
            deadline = time.monotonic() + self.window_s
            while self._count(first.reader) < self.max_batch and self._arriving > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)  # an arrival or a new reading wakes it
            batch = [r for r in self._waiting if r.reader is first.reader][: self.max_batch]
        else:
            batch = [first]
        taken = {id(r) for r in batch}
        self._waiting = [r for r in self._waiting if id(r) not in taken]
        return batch

    def _count(self, reader: Any) -> int:
        return sum(r.reader is reader for r in self._waiting)

    @staticmethod
    def _read(batch: list[_Reading]) -> None:
        reader = batch[0].reader
        try:
            if len(batch) == 1:
                answers = [reader.generate(*batch[0].item)]
            else:
                answers = reader.generate_batch([r.item for r in batch])
            for reading, answer in zip(batch, answers, strict=True):
                reading.answer = answer
        except BaseException as exc:  # every reading of the batch learns why
            for reading in batch:
                reading.error = exc
        finally:
            for reading in batch:
                reading.done = True

    def _tell(self, batch: list[_Reading]) -> None:
        if self.on_batch is None:
            return
        now = time.monotonic()
        try:
            self.on_batch(len(batch), [now - r.arrived for r in batch])
        except Exception:  # a metric must never cost an answer
            log.exception("reader batching: on_batch failed; the batch is read all the same")


class BatchingReader:
    """A reader whose `generate` goes through a `ReaderBatcher`; everything else is the reader's own."""

    def __init__(self, reader: Any, batcher: ReaderBatcher) -> None:
        self.reader = reader
        self.batcher = batcher
        self.name = reader.name

    def __getattr__(self, name: str) -> Any:  # n_passages, context, precision ...
        return getattr(self.reader, name)

    def generate(self, question: str, as_of: dt.date, passages: Sequence[RetrievedPassage]) -> ReaderAnswer:
        return self.batcher.generate(self.reader, question, as_of, passages)
