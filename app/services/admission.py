"""How many questions are answered at once, how many may wait, and for how long.

A generative reader takes every core it is given: answering eight questions at once does not make
any of them faster, it makes all of them eight times slower. So the answer endpoints (the JSON API
and the ask page) go through one gate per process:

- up to `max_active` answers run at a time (SQA_ANSWER_CONCURRENCY);
- up to `max_waiting` more wait their turn (SQA_ANSWER_QUEUE); a request beyond that is refused at
  once with 503 and Retry-After;
- `max_wait_s` (SQA_ANSWER_WAIT_S) bounds a request's whole time, waiting plus answering: a request
  waits for a place at most `max_wait_s` less the time an answer may take (the longest of the last
  20 answers actually timed, never a guess), and is refused the same way when none has freed by
  then, instead of waiting a minute behind the others or being answered after the limit only
  because the answer came on top of a full wait.

Nothing is refused on a forecast: a request is turned away only when the waiting room is full or
when its own wait ran out. The process's first answer pays lazy loading (models, the snapshot) and
is not counted; answer times count once MIN_TIMED are known. Retry-After is the time the queue
ahead is expected to take, from a moving average of recent answer times. Background work
(evaluation, training) calls the answer service directly and is not gated: it is throttled by its
own job slots.
"""
from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from typing import Iterator

from app.services.errors import ServiceError


class OverloadedError(ServiceError):
    """Too many questions at once: 503 with Retry-After."""

    status_code = 503

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.retry_after_s)))}


ANSWERS_KEPT = 20  # the answer times the wait budget is taken from
MIN_TIMED = 3  # answers timed before their times count


class AdmissionGate:
    """A counting gate with a bounded, time-limited waiting room (thread-safe).

    Example:
        >>> gate = AdmissionGate(max_active=1, max_waiting=0, max_wait_s=1.0)
        >>> with gate.admit():
        ...     gate.active
        1
    """

    def __init__(self, *, max_active: int, max_waiting: int, max_wait_s: float) -> None:
        if max_active < 1:
            raise ValueError(f"max_active {max_active} must be at least 1")
        if max_waiting < 0 or max_wait_s < 0:
            raise ValueError(f"max_waiting {max_waiting} and max_wait_s {max_wait_s} must not be negative")
        self.max_active, self.max_waiting, self.max_wait_s = max_active, max_waiting, max_wait_s
        self._cond = threading.Condition()
        self._active = 0
        self._waiting = 0
        self._mean_s = 1.0  # moving average of an answer's time, for Retry-After
        self._recent: collections.deque[float] = collections.deque(maxlen=ANSWERS_KEPT)  # seconds each
        self._warm = False  # the first answer was timed (and left out)
        self.refused = 0  # since start, for the logs and tests

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return self._waiting

    def _retry_after(self) -> float:
        return self._mean_s * (self._waiting + self._active) / self.max_active

    def answer_s(self) -> float:
        """The time an answer may take, for the wait budget: the longest of the last ANSWERS_KEPT
        answers (0 until MIN_TIMED were timed: no guess). The longest, not a typical one: a request
        that waited its whole budget must still be answered within the limit.

        Example:
            >>> gate = AdmissionGate(max_active=1, max_waiting=1, max_wait_s=5)
            >>> gate.answer_s(), gate.wait_budget_s()
            (0.0, 5.0)
        """
        return max(self._recent) if len(self._recent) >= MIN_TIMED else 0.0

    def timed(self, seconds: float) -> None:
        """Count one answer's time (admit() does, under the gate's lock; tests call it directly).
        The first is left out: it pays the process's lazy loading."""
        if not self._warm:
            self._warm = True
            return
        self._mean_s = 0.8 * self._mean_s + 0.2 * seconds
        self._recent.append(seconds)

    def wait_budget_s(self) -> float:
        """How long a request may wait for a place and still be answered within max_wait_s."""
        return max(0.0, self.max_wait_s - self.answer_s())

    def _refuse(self, why: str) -> OverloadedError:
        self.refused += 1
        retry = self._retry_after()
        return OverloadedError(f"the server is busy: {why}; try again in about {max(1, math.ceil(retry))} s",
                               retry)

    @contextlib.contextmanager
    def admit(self, since: float | None = None) -> Iterator[float]:
        """Hold one of the `max_active` places for the duration of the block (OverloadedError if
        none frees up in time, or if the waiting room is full). `since`: when the request arrived
        (time.monotonic()); the time it already spent before the gate comes off its wait. Yields the
        seconds from `since` (else from the call) until the place was given: the request's queue time."""
        called = time.monotonic()
        with self._cond:
            if self._active >= self.max_active:
                if self._waiting >= self.max_waiting:
                    raise self._refuse(f"{self._active} questions are being answered and {self._waiting} are "
                                       "waiting (SQA_ANSWER_QUEUE)")
                spent = max(0.0, time.monotonic() - since) if since is not None else 0.0
                budget = max(0.0, self.wait_budget_s() - spent)
                self._waiting += 1
                try:
                    started = self._cond.wait_for(lambda: self._active < self.max_active, timeout=budget)
                finally:
                    self._waiting -= 1
                if not started:
                    raise self._refuse(f"no answer slot freed up within {budget:.1f} s, and an answer takes about "
                                       f"{self.answer_s():.1f} s: it would not be answered within "
                                       f"{self.max_wait_s:g} s (SQA_ANSWER_WAIT_S)")
            self._active += 1
        t0 = time.monotonic()
        try:
            yield t0 - (since if since is not None else called)
        finally:
            took = time.monotonic() - t0
            with self._cond:
                self._active -= 1
                self.timed(took)
                self._cond.notify()
