"""The answer path as plain Python: dated question -> time-filtered retrieval -> reader.

Used by the API, the CLI (`sqa ask`) and evaluation alike. Nothing published after `as_of`
reaches the reader: the index filters by id range, and the fetched rows are checked again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy.orm import Session, sessionmaker

from evaluation.metrics import answer_support
from models.answer_forms import FormedReader
from models.encoders import TextEncoder
from models.reader_base import RetrievedPassage
from models.readers import Reader
from models.voting import VotingReader
from serving.answer_cache import AnswerCache, AnswerKey
from serving.answer_forms import AnswerFormsSource
from serving.errors import IndexNotReadyError, InvalidInputError
from serving.index_state import IndexState, LoadedSnapshot
from serving.reader_batching import BatchingReader, ReaderBatcher, batches
from serving.reader_state import ReaderState
from serving.retrieval import DenseRetriever, Retriever

log = logging.getLogger(__name__)


def _as_of(as_of: dt.date | None) -> dt.date:
    """A question's date: the one given, or today (UTC)."""
    return as_of or dt.datetime.now(dt.UTC).date()


@dataclass(frozen=True)
class AnswerResult:
    answer: str
    as_of: dt.date
    passages: list[RetrievedPassage]
    versions: dict[str, str]
    timings_ms: dict[str, float]
    notes: list[str] = field(default_factory=list)
    # The passage_ids of the passages the reader read that state the answer, in rank order: empty
    # when none does (the answer is then the reader's inference or a guess; see answer_evidence).
    evidence: list[int] = field(default_factory=list)
    # The reader's probability of the line it wrote (models.reader_base.ReaderAnswer.confidence);
    # None when the reader gives none or nothing was read.
    confidence: float | None = None

    @property
    def grounded(self) -> bool:
        """Whether a passage the reader read states the answer."""
        return bool(self.evidence)


def answer_evidence(answer: str, passages: Iterable[RetrievedPassage]) -> list[int]:
    """The positions of `passages` whose headline or body states `answer` as a whole-token span,
    both SQuAD-normalised (`evaluation.metrics.answer_support`); the body has no date prefix, so
    "Friday" is not found in the date a model reads before it."""
    return answer_support(answer, [f"{p.title}. {p.text}" for p in passages])


@dataclass(frozen=True)
class AnswerLimits:
    default_top_k: int = 5
    max_top_k: int = 50
    reader_passages: int = 3
    max_question_chars: int = 1000
    vote_depth: int = 0  # SQA_READER_VOTE: passages also read one by one and voted on (models.voting)


class AnswerService:
    def __init__(
        self,
        *,
        encoder: TextEncoder,
        reader: Reader | ReaderState,
        index_state: IndexState,
        session_factory: sessionmaker[Session],
        limits: AnswerLimits,
        retriever: Retriever | None = None,
        forms: AnswerFormsSource | None = None,
        batch: int = 1,
        batch_window_s: float = 0.02,
        cache_entries: int = 0,
    ) -> None:
        """`reader`: a Reader that serves for good, or a ReaderState that may swap readers.
        `retriever`: DenseRetriever(encoder) when None (SQA_RETRIEVER: `serving.retrieval`).
        `forms`: the answer forms the serving reader's answers are rewritten to (SQA_ANSWER_FORMS).
        `batch`: concurrent questions read in one model call at most (SQA_READER_BATCH; 1: each
        alone), gathered for at most `batch_window_s` (serving.reader_batching). `cache_entries`:
        answers kept for a question asked again (serving.answer_cache; 0: none)."""
        self.retriever = retriever if retriever is not None else DenseRetriever(encoder)
        self.reader_state = reader if isinstance(reader, ReaderState) else ReaderState(reader)
        self.index_state = index_state
        self.session_factory = session_factory
        self.limits = limits
        self.forms = forms
        self.batcher = ReaderBatcher(max_batch=batch, window_s=batch_window_s) if batch > 1 else None
        self.cache: AnswerCache[AnswerResult] | None = AnswerCache(cache_entries) if cache_entries else None

    def passages_for(self, reader: Reader) -> int:
        """SQA_READER_PASSAGES, or when it is 0 the reader's own number (a trained reader's
        config, Gemma's 3)."""
        return self.limits.reader_passages or getattr(reader, "n_passages", None) or 3

    def validate(self, question: str, top_k: int | None) -> tuple[str, int]:
        text = (question or "").strip()
        if not text:
            raise InvalidInputError("question is empty")
        if len(text) > self.limits.max_question_chars:
            raise InvalidInputError(
                f"question is {len(text)} characters long; the limit is {self.limits.max_question_chars}"
            )
        k = self.limits.default_top_k if top_k is None else top_k
        if not 1 <= k <= self.limits.max_top_k:
            raise InvalidInputError(f"top_k {k} is out of range (1..{self.limits.max_top_k})")
        return text, k

    @property
    def reader(self) -> Reader:
        """The reader serving now; a request takes it once (a swap may replace it at any moment).
        With a batcher, its readings are batched with concurrent ones (serving.reader_batching); with
        a vote depth, that reader votes across passages (models.voting.VotingReader); with answer
        forms, its answers are rewritten to them (models.answer_forms.FormedReader)."""
        serving = self.reader_state.current()  # taken once: the forms are those of this reader's cut
        assert serving is not None, "ReaderState.refresh() must run before the first request"
        reader = serving.reader
        if self.batcher is not None and batches(reader):
            reader = BatchingReader(reader, self.batcher)
        if self.limits.vote_depth:
            reader = VotingReader(reader, depth=self.limits.vote_depth)
        forms = self.forms.forms_for(serving) if self.forms is not None else None
        return FormedReader(reader, forms) if forms is not None else reader

    def answer(
        self,
        question: str,
        as_of: dt.date | None = None,
        top_k: int | None = None,
        *,
        snapshot: LoadedSnapshot | None = None,
        read: bool = True,
        index_as_of: dt.date | None = None,
    ) -> AnswerResult:
        """Answer from the serving snapshot (or the one given, as evaluation does).

        `read=False` retrieves only (the answer is empty): evaluation's retrieval-only questions.
        `index_as_of` (on or before `as_of`): retrieve only what was published by then, while the
        question is still asked as of `as_of`: the index an ingest schedule would have had that day
        (bench/bench_live.py's monthly schedule).
        """
        t0 = time.perf_counter()
        # Always computed: a caller that serves looks `cached` up first, before the answer gate (a
        # hit inside the gate would enter the gate's answer times as a read of a few microseconds).
        # The serving path's answers are kept for it; evaluations that pin a snapshot or an
        # `index_as_of` are not.
        serving = snapshot is None and read and index_as_of is None
        # With a batcher, a batch leader waits for this question until it reaches the reader.
        with self.batcher.arrival() if self.batcher is not None else contextlib.nullcontext():
            result = self._answer(question, as_of, top_k, snapshot, read, index_as_of, t0)
        if serving and self.cache is not None:
            self.cache.put(self._key(question, result.as_of, top_k, result.versions), result)
        return result

    def _key(self, question: str, as_of: dt.date, top_k: int | None, versions: dict[str, str]) -> AnswerKey:
        text, k = self.validate(question, top_k)
        snapshot, reader, retriever = versions["index_snapshot"], versions["reader"], versions["retriever"]
        return AnswerKey.of(text, as_of, k, self.limits.reader_passages, snapshot, reader, retriever)

    def cached(self, question: str, as_of: dt.date | None = None, top_k: int | None = None) -> AnswerResult | None:
        """The answer given before to the same question, `as_of` and `top_k` over the serving snapshot
        with the models serving now (serving.answer_cache), its timings this lookup's ("cache",
        "total"); None when there is none, no cache, or no index yet. The API and the ask page look
        it up before the answer gate: a hit takes no place there. Bad input raises as `answer` does."""
        if self.cache is None:
            return None
        t0 = time.perf_counter()
        snapshot = self.index_state.current()
        if snapshot is None:
            return None
        hit = self.cache.get(self._key(question, _as_of(as_of), top_k, self._versions(snapshot, self.reader)))
        if hit is None:
            return None
        ms = round((time.perf_counter() - t0) * 1000, 3)
        return dataclasses.replace(hit, timings_ms={"cache": ms, "total": ms})

    def _versions(self, snapshot: LoadedSnapshot, reader: Reader) -> dict[str, str]:
        """What answers over `snapshot` with `reader` now: an answer's `versions`, its cache key's too."""
        return {
            "index_snapshot": snapshot.snapshot_id,
            "encoder": snapshot.manifest.encoder,
            "reader": reader.name,
            "retriever": self.retriever.name,
        }

    def _answer(
        self,
        question: str,
        as_of: dt.date | None,
        top_k: int | None,
        snapshot: LoadedSnapshot | None,
        read: bool,
        index_as_of: dt.date | None,
        t0: float,
    ) -> AnswerResult:
        text, k = self.validate(question, top_k)
        as_of = _as_of(as_of)
        # Held for the whole request: a swap does not disturb them.
        reader = self.reader
        snapshot = snapshot if snapshot is not None else self.index_state.current()
        if snapshot is None:
            raise IndexNotReadyError("no index has been built yet: run `sqa ingest --through YYYY-MM` first")
        notes = []
        newest = snapshot.newest_day
        if newest is not None and as_of > newest:
            notes.append(f"as_of {as_of} is after the newest indexed article ({newest}); answered from what is indexed")
        n_read = self.passages_for(reader)
        if index_as_of is not None and index_as_of > as_of:
            raise InvalidInputError(f"index_as_of {index_as_of} is after as_of {as_of}")
        t1 = time.perf_counter()
        stages: dict[str, float] = {}
        with self.session_factory() as session:  # the reader may read deeper than top_k: show what it read
            passages = self.retriever.retrieve(
                session, snapshot, text, index_as_of or as_of, max(k, n_read) if read else k, timings=stages
            )
        t2 = time.perf_counter()
        answer_text, confidence = "", None
        if not passages:
            notes.append(f"no indexed passage was published on or before {as_of}")
        elif read:
            reading = reader.generate(text, as_of, passages[:n_read])
            answer_text, confidence = reading.text, getattr(reading, "confidence", None)
        t3 = time.perf_counter()
        evidence = [passages[i].passage_id for i in answer_evidence(answer_text, passages[:n_read])]
        versions = self._versions(snapshot, reader)
        retrieve_ms = round((t2 - t1) * 1000, 2)
        if "rerank" in stages:  # retrieve: the first stage; rerank: the re-ranker version
            timings = {"retrieve": round(retrieve_ms - stages["rerank"], 2), "rerank": stages["rerank"]}
        else:
            timings = {"retrieve": retrieve_ms}
        timings.update(read=round((t3 - t2) * 1000, 2), total=round((t3 - t0) * 1000, 2))
        return AnswerResult(
            answer_text,
            as_of,
            passages,
            versions,
            timings,
            notes,
            evidence,
            None if confidence is None else round(confidence, 4),
        )
