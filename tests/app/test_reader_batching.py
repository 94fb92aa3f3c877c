"""Concurrent readings gathered into batches (serving/reader_batching.py), and Gemma's batched read.

The batcher's tests are deterministic: every asking thread takes its `arrival()` before any of them
reads, so a leader waits for exactly those questions and no test depends on a thread's timing.
"""

from __future__ import annotations

import datetime as dt
import threading

import pytest

from models.reader_base import ReaderAnswer, RetrievedPassage
from models.readers import FirstEntityReader
from serving.reader_batching import BatchingReader, ReaderBatcher, batches

DAY = dt.date(2024, 3, 1)


def passage(text: str, day: dt.date = DAY) -> RetrievedPassage:
    return RetrievedPassage(title="", text=text, published=day)


class FakeBatchReader:
    """Answers each question with its own text upper-cased; records every call and how many ran at once."""

    name = "fake-batch"

    def __init__(self, *, batch: bool = True, fail: bool = False) -> None:
        self.batch = batch
        self.fail = fail
        self.calls: list[list[str]] = []
        self.running = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def batches(self) -> bool:
        return self.batch

    def _enter(self, questions: list[str]) -> None:
        with self.lock:
            self.calls.append(questions)
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)

    def _leave(self) -> None:
        with self.lock:
            self.running -= 1

    def generate(self, question, as_of, passages) -> ReaderAnswer:
        return self.generate_batch([(question, as_of, passages)])[0]

    def generate_batch(self, items) -> list[ReaderAnswer]:
        self._enter([q for q, _, _ in items])
        try:
            if self.fail:
                raise RuntimeError("the model ran out of memory")
            return [ReaderAnswer(text=q.upper(), raw=q, confidence=0.5) for q, _, _ in items]
        finally:
            self._leave()


def ask_all(batcher: ReaderBatcher, reader, questions: list[str]):
    """Each question from its own thread, all started together (each on its way to the reader, as an
    AnswerService question is, before any reads); returns {question: answer or error}."""
    out: dict[str, object] = {}
    start = threading.Barrier(len(questions))

    def ask(q: str) -> None:
        batcher.arrival()
        start.wait()
        try:
            out[q] = batcher.generate(reader, q, DAY, [passage(q)]).text
        except Exception as exc:  # noqa: BLE001 (the test looks at it)
            out[q] = exc

    threads = [threading.Thread(target=ask, args=(q,)) for q in questions]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a reading never came back"
    return out


class Told:
    """What a batcher told of its batches (its `on_batch`)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.waits: list[float] = []

    def __call__(self, size: int, waits: list[float]) -> None:
        self.sizes.append(size)
        self.waits.extend(waits)


def make_batcher(max_batch: int) -> ReaderBatcher:
    # a generous window: the leader waits for the readings still arriving, never for the clock
    return ReaderBatcher(max_batch=max_batch, window_s=30, on_batch=Told())


def ask_together(questions: list[str], max_batch: int, reader) -> tuple[dict[str, object], ReaderBatcher]:
    """`questions` asked at once of `reader` through a batcher of `max_batch`: (answers, batcher)."""
    batcher = make_batcher(max_batch)
    return ask_all(batcher, reader, questions), batcher


def test_concurrent_readings_are_read_in_one_batch_and_each_gets_its_own_answer():
    questions = [f"who is number {i}?" for i in range(4)]
    reader = FakeBatchReader()
    out, batcher = ask_together(questions, 8, reader)
    assert out == {q: q.upper() for q in questions}
    assert len(reader.calls) == 1 and sorted(reader.calls[0]) == sorted(questions)
    assert batcher.on_batch.sizes == [4] and len(batcher.on_batch.waits) == 4


def test_a_batch_holds_at_most_max_batch_and_the_rest_follow():
    questions = [f"q{i}" for i in range(6)]
    reader = FakeBatchReader()
    out, batcher = ask_together(questions, 4, reader)
    assert out == {q: q.upper() for q in questions}
    assert sorted(len(c) for c in reader.calls) == [2, 4]
    assert sorted(batcher.on_batch.sizes) == [2, 4]
    assert reader.most_at_once == 1  # one model call at a time
    assert sorted(q for c in reader.calls for q in c) == sorted(questions)  # each read once


def test_a_reader_that_does_not_batch_reads_one_question_at_a_time():
    questions = [f"q{i}" for i in range(5)]
    reader = FakeBatchReader(batch=False)
    out, _ = ask_together(questions, 8, reader)
    assert out == {q: q.upper() for q in questions}
    assert [len(c) for c in reader.calls] == [1] * 5
    assert reader.most_at_once == 1


def test_a_failed_batch_fails_every_reading_it_held_and_the_next_ones_still_run():
    questions = [f"q{i}" for i in range(3)]
    failing = FakeBatchReader(fail=True)
    out, batcher = ask_together(questions, 8, failing)
    assert all(isinstance(v, RuntimeError) and "out of memory" in str(v) for v in out.values())
    healthy = FakeBatchReader()
    assert batcher.generate(healthy, "after", DAY, [passage("x")]).text == "AFTER"  # the batcher is free again


def test_a_failing_metric_costs_no_answer():
    def broken(size, waits):
        raise RuntimeError("the registry is gone")

    batcher = ReaderBatcher(max_batch=4, window_s=0, on_batch=broken)
    assert batcher.generate(FakeBatchReader(), "still?", DAY, [passage("x")]).text == "STILL?"


def test_one_client_alone_is_read_at_once_without_waiting_the_window():
    told = Told()
    batcher = ReaderBatcher(max_batch=8, window_s=30, on_batch=told)
    reader = FakeBatchReader()
    assert batcher.generate(reader, "alone?", DAY, [passage("x")]).text == "ALONE?"
    assert told.sizes == [1] and told.waits[0] < 10  # it did not wait for the 30 s window


def test_readings_of_two_readers_never_share_a_batch():
    """A reader swap mid-load: each batch is read by one reader only."""
    batcher = ReaderBatcher(max_batch=8, window_s=30)
    old, new = FakeBatchReader(), FakeBatchReader()
    out: dict[str, str] = {}
    start = threading.Barrier(4)

    def ask(reader, q):
        batcher.arrival()
        start.wait()
        out[q] = batcher.generate(reader, q, DAY, [passage(q)]).text

    threads = [threading.Thread(target=ask, args=(r, q)) for r, q in ((old, "a"), (new, "b"), (old, "c"), (new, "d"))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert out == {"a": "A", "b": "B", "c": "C", "d": "D"}
    assert sorted(q for c in old.calls for q in c) == ["a", "c"]
    assert sorted(q for c in new.calls for q in c) == ["b", "d"]


def test_batching_reader_passes_everything_else_through():
    reader = FakeBatchReader()
    reader.n_passages = 5  # type: ignore[attr-defined]
    wrapped = BatchingReader(reader, ReaderBatcher(max_batch=4))
    assert wrapped.name == "fake-batch" and wrapped.n_passages == 5
    assert wrapped.generate("hi", DAY, [passage("x")]).text == "HI"
    assert batches(reader) and not batches(FakeBatchReader(batch=False)) and not batches(object())


@pytest.mark.parametrize("max_batch, window", [(0, 0.02), (4, -1)])
def test_batcher_rejects_bad_sizes(max_batch, window):
    with pytest.raises(ValueError, match="max_batch|window_s"):
        ReaderBatcher(max_batch=max_batch, window_s=window)


def test_gemma_reads_a_batch_as_it_reads_each_question_alone(tiny_gemma_cache):
    """Left-padded prompts of different lengths, decoded together: the same answers and confidences
    as one by one; a question without passages still gets the empty answer."""
    from models.gemma import GemmaReader

    reader = GemmaReader.load(cache_dir=tiny_gemma_cache, n_passages=3, max_new_tokens=6)
    assert reader.batches()
    items = [
        ("Who won the final?", DAY, [passage("The Denver Nuggets beat the Miami Heat in the final.")]),
        ("Where?", DAY, []),
        (
            "Which city hosted the summit on climate finance this week?",
            DAY,
            [passage("Leaders met in Paris."), passage("Markets rose in Tokyo on Monday as investors waited.")],
        ),
        ("What fell?", DAY, [passage("Snow fell in Denver.", DAY - dt.timedelta(days=3))]),
    ]
    alone = [reader.generate(*item) for item in items]
    together = reader.generate_batch(items)
    assert [a.raw for a in together] == [a.raw for a in alone]
    assert [a.text for a in together] == [a.text for a in alone]
    assert together[1] == ReaderAnswer(text="", raw="")
    for a, b in zip(alone, together):
        if a.confidence is not None:
            assert b.confidence == pytest.approx(a.confidence, rel=1e-3, abs=1e-6)


def test_gemma_with_beams_reads_a_batch_one_question_at_a_time(tiny_gemma_cache):
    from models.gemma import GemmaReader

    reader = GemmaReader.load(cache_dir=tiny_gemma_cache, n_passages=3, max_new_tokens=4, answer_beams=2)
    assert not reader.batches()
    items = [("Who?", DAY, [passage("Ada Lovelace wrote.")]), ("What?", DAY, [passage("Rain fell.")])]
    assert [a.text for a in reader.generate_batch(items)] == [reader.generate(*i).text for i in items]


def test_gemma_batch_refuses_a_passage_after_as_of():
    from models.gemma import GemmaReader

    reader = GemmaReader(object(), object())
    late = ("Who?", DAY, [passage("Later news.", DAY + dt.timedelta(days=1))])
    with pytest.raises(AssertionError, match="after"):
        reader.generate_batch([("Fine?", DAY, [passage("ok")]), late])


class BatchingFirstEntity(FirstEntityReader):
    """The first-entity fake, reading a batch as it reads each of its questions; counts its calls."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.lock = threading.Lock()

    def batches(self) -> bool:
        return True

    def generate(self, question, as_of, passages) -> ReaderAnswer:
        return self.generate_batch([(question, as_of, passages)])[0]

    def generate_batch(self, items) -> list[ReaderAnswer]:
        with self.lock:
            self.sizes.append(len(items))
        return [FirstEntityReader.generate(self, *item) for item in items]


def test_concurrent_questions_to_the_api_are_batched_and_their_batches_counted_at_metrics(make_settings, database_url):
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from app.main import create_app
    from serving.reader_state import ReaderState
    from tests.conftest import load_sample

    settings = make_settings(
        database_url=database_url, reader_batch=4, answer_concurrency=4, rate_limit="", answer_cache=0
    )
    load_sample(settings)
    body = {"question": "Who is the mayor of Port Calder?", "as_of": "2024-01-31"}
    with TestClient(create_app(settings)) as client:
        reader = BatchingFirstEntity()
        client.app.state.answers.reader_state = ReaderState(reader)
        results: list = []
        start = threading.Barrier(4)

        def ask() -> None:
            start.wait()
            results.append(client.post("/v1/answers", json=body))

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        alone = client.post("/v1/answers", json=body)
        assert alone.status_code == 200 and alone.json()["answer"]
        assert [r.status_code for r in results] == [200] * 4
        assert {r.json()["answer"] for r in results} == {alone.json()["answer"]}  # as read alone
        metrics = {
            s.name: s.value
            for family in text_string_to_metric_families(client.get("/metrics").text)
            for s in family.samples
            if not s.labels or set(s.labels) == {"le"} and s.labels["le"] == "+Inf"
        }
    assert sum(reader.sizes) == 5 and max(reader.sizes) <= 4  # each of the five read once, four at most together
    assert metrics["sqa_reader_batch_size_sum"] == 5
    assert metrics["sqa_reader_batch_size_count"] == len(reader.sizes)
    assert metrics["sqa_reader_batch_wait_seconds_count"] == 5
