"""How many questions are answered at once, how many may wait, and for how long.

A generative reader takes every core it is given: answering eight questions at once does not make
any of them faster, it makes all of them eight times slower. So the answer endpoints (the JSON API
and the ask page) go through one gate per process:

- up to `max_active` answers run at a time (SQA_ANSWER_CONCURRENCY);
- up to `max_waiting` more wait their turn (SQA_ANSWER_QUEUE); a request beyond that is refused at
  once with 503 and Retry-After;
- `max_wait_s` (SQA_ANSWER_WAIT_S) bounds a request's whole time in the server, from its arrival to
  its answer: a request waits for a place only as long as still leaves it the time an answer takes,
  and is refused the same way when none has freed by then, instead of waiting a minute behind the
  others or being answered after the limit only because the answer came on top of a full wait.

The time an answer takes is the longest of the last 20 answers, and at least as long as the
answers running now have already taken: a cold process, which has timed nothing yet, still learns
from the answers in flight and does not let its first waiters wait the whole limit. Nothing is
refused on a forecast: a request is turned away only when the waiting room is full or when its own
wait ran out. Retry-After is the time the queue ahead is expected to take, from a moving average of
recent answer times. Background work (evaluation, training) calls the answer service directly and
is not gated: it is throttled by its own job slots.
"""

from __future__ import annotations

import collections
import contextlib
import math
import threading
import time
from collections.abc import Iterator

from serving.errors import ServiceError


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
RECHECK_S = 0.05  # how often a waiting request looks again at the answers in flight
REFUSAL_REASONS = ("queue_full", "wait_budget")  # why a request was turned away (`refusals`)


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
        self._queue: collections.deque[object] = collections.deque()  # the waiting requests, in arrival order
        self._mean_s = 1.0  # moving average of an answer's time, for Retry-After
        self._recent: collections.deque[float] = collections.deque(maxlen=ANSWERS_KEPT)  # seconds each
        self._running: dict[object, float] = {}  # the answers in flight: their turn -> when each started
        self.refused = 0  # since start, for the logs and tests
        self._refused_by: collections.Counter[str] = collections.Counter()  # the same, by REFUSAL_REASONS

    @property
    def active(self) -> int:
        return self._active

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def refusals(self) -> dict[str, int]:
        """Requests refused since start, by reason: "queue_full" (SQA_ANSWER_QUEUE) and "wait_budget"
        (no place freed in time for SQA_ANSWER_WAIT_S); a copy, for /metrics."""
        with self._cond:
            return {reason: self._refused_by[reason] for reason in REFUSAL_REASONS}

    def _retry_after(self) -> float:
        return self._mean_s * (len(self._queue) + self._active) / self.max_active

    def answer_s(self, now: float | None = None) -> float:
        """The time an answer may take, for the wait budget: the longest of the last ANSWERS_KEPT
        answers, and at least the time the oldest answer in flight has already run (0 while nothing
        was timed and nothing runs). The longest, not a typical one: a request that waited its
        whole budget must still be answered within the limit.

        Example:
            >>> gate = AdmissionGate(max_active=1, max_waiting=1, max_wait_s=5)
            >>> gate.answer_s(), gate.wait_budget_s()
            (0.0, 5.0)
            >>> gate.timed(1.5)
            >>> gate.answer_s(), gate.wait_budget_s()
            (1.5, 3.5)
        """
        now = time.monotonic() if now is None else now
        running = max((now - t for t in self._running.values()), default=0.0)
        return max(max(self._recent, default=0.0), running)

    def timed(self, seconds: float) -> None:
        """Count one answer's time (admit() does, under the gate's lock; tests call it directly)."""
        self._mean_s = 0.8 * self._mean_s + 0.2 * seconds if self._recent else seconds
        self._recent.append(seconds)

    def wait_budget_s(self, now: float | None = None) -> float:
        """How long a request may wait for a place and still be answered within max_wait_s."""
        return max(0.0, self.max_wait_s - self.answer_s(now))

    def _refuse(self, reason: str, why: str) -> OverloadedError:
        self.refused += 1
        self._refused_by[reason] += 1
        retry = self._retry_after()
        return OverloadedError(f"the server is busy: {why}; try again in about {max(1, math.ceil(retry))} s", retry)

    @contextlib.contextmanager
    def admit(self, since: float | None = None) -> Iterator[float]:
        """Hold one of the `max_active` places for the duration of the block (OverloadedError if
        none frees up in time, or if the waiting room is full). `since`: when the request arrived
        (time.monotonic()); the time it already spent before the gate comes off its wait. Yields the
        seconds from `since` (else from the call) until the place was given: the request's queue time."""
        called = time.monotonic()
        start = since if since is not None else called
        with self._cond:
            if self._active >= self.max_active or self._queue:  # first come, first served
                if len(self._queue) >= self.max_waiting:
                    raise self._refuse(
                        "queue_full",
                        f"{self._active} questions are being answered and {len(self._queue)} are "
                        "waiting (SQA_ANSWER_QUEUE)",
                    )
                turn = object()
                self._queue.append(turn)
                try:
                    while self._active >= self.max_active or self._queue[0] is not turn:
                        now = time.monotonic()
                        # looked at again as answers finish, and as the one in flight runs on
                        waited = max(0.0, now - start)
                        left = self.wait_budget_s(now) - waited
                        if left <= 0:
                            raise self._refuse(
                                "wait_budget",
                                f"no answer slot freed up within {waited:.1f} s, and an answer takes about "
                                f"{self.answer_s(now):.1f} s: it would not be answered within "
                                f"{self.max_wait_s:g} s (SQA_ANSWER_WAIT_S)",
                            )
                        self._cond.wait(min(left, RECHECK_S))
                finally:
                    self._queue.remove(turn)
                    self._cond.notify_all()  # the next in line may go, or re-check its own budget
            self._active += 1
            ticket = object()
            t0 = self._running[ticket] = time.monotonic()
        try:
            yield t0 - start
        finally:
            with self._cond:
                took = time.monotonic() - t0
                del self._running[ticket]
                self._active -= 1
                self.timed(took)
                self._cond.notify_all()  # the first in line takes the place
