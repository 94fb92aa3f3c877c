"""Progress of long jobs: a tqdm bar for people, and the job row for the API."""

from __future__ import annotations

import os
import sys
import time
from typing import Protocol

from sqlalchemy.orm import Session, sessionmaker
from tqdm import tqdm

from store.base import utcnow
from store.tables import Job


class Progress(Protocol):
    def stage(self, name: str, total: int) -> None: ...

    def advance(self, n: int = 1) -> None: ...


class JobProgress:
    """Writes stage, fraction done and a heartbeat to the job row (at most every `every_s`),
    and drives a tqdm bar on stderr when `bar` is true."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        job_id: int,
        *,
        bar: bool = False,
        every_s: float = 1.0,
        weights: dict[str, float] | None = None,
    ) -> None:
        self._sf = session_factory
        self.job_id = job_id
        self._bar_enabled = bar
        self._bar = None
        self._every = every_s
        self._weights = weights or {}
        self._rounds = 1  # the weighted stages run this many times (a multi-month ingest: once a month)
        self._done_weight = 0.0
        self._stage = ""
        self._total = 0
        self._count = 0
        self._last = 0.0

    def stage(self, name: str, total: int) -> None:
        if self._stage:
            self._done_weight += self._weights.get(self._stage, 0.0)
        self._stage, self._total, self._count = name, max(total, 0), 0
        if self._bar is not None:
            self._bar.close()
        if self._bar_enabled:
            self._bar = tqdm(total=total, desc=name, unit="it", file=sys.stderr, dynamic_ncols=True)
        self._write(force=True)

    def rounds(self, n: int) -> None:
        """The weighted stages will run `n` times (say, once per month of an ingest): each round is
        1/n of the whole, so the fraction reaches 1 with the last round, not the first."""
        self._rounds = max(1, n)

    def advance(self, n: int = 1) -> None:
        self._count += n
        if self._bar is not None:
            self._bar.update(n)
        self._write()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    @property
    def fraction(self) -> float:
        """Weighted over stages when weights are given, else the current stage's own fraction."""
        inside = self._count / self._total if self._total else 0.0
        if not self._weights:
            return min(1.0, inside)
        w = self._weights.get(self._stage, 0.0)
        return min(1.0, (self._done_weight + w * inside) / self._rounds)

    def _write(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every:
            return
        self._last = now
        with self._sf() as session:
            job = session.get(Job, self.job_id)
            if job is None:
                return
            job.progress = round(self.fraction, 4)
            job.message = f"{self._stage}: {self._count}/{self._total}"
            job.heartbeat_at = utcnow()
            job.pid = os.getpid()
            session.commit()


def fraction_reporter(progress: Progress | None, logger, stage: str = "train", steps: int = 1000):
    """A `report(fraction, message)` callback for training loops: opens `stage` on `progress` (if
    any) and advances it to the fraction done; every message goes to `logger`."""
    if progress:
        progress.stage(stage, steps)
    done = [0]

    def report(frac: float, message: str) -> None:
        if progress and int(frac * steps) > done[0]:
            progress.advance(int(frac * steps) - done[0])
            done[0] = int(frac * steps)
        logger.info(message)

    return report


class NullProgress:
    """A Progress that reports nothing (a caller without a job)."""

    def stage(self, name: str, total: int) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass
