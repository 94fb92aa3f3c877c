"""The answer cache (serving/answer_cache.py): a question asked again over the same snapshot and
models is answered without reading and without a turn at the answer gate; anything that could change
the answer (as_of, top_k, the snapshot, the reader, the re-ranker) asks the reader again."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from models.readers import FirstEntityReader
from serving.answer_cache import AnswerCache, AnswerKey
from serving.reader_state import ReaderState
from tests import loaded

loaded_settings = loaded.loaded_settings  # the sample copied from a template: overrides conftest's fixture here

ADMIN = {"X-Admin-Token": "test-admin-token"}
MAYOR = {"question": "Who is the mayor of Port Calder?", "as_of": "2024-01-31"}


class CountingReader(FirstEntityReader):
    """The first-entity fake, counting the questions it reads; `gate` (when set) holds each reading
    until it is set, `reading` is set while one is held."""

    def __init__(self, name: str = "first-entity") -> None:
        self.name = name
        self.read: list[str] = []
        self.gate: threading.Event | None = None
        self.reading = threading.Event()

    def generate(self, question, as_of, passages):
        self.read.append(question)
        if self.gate is not None:
            self.reading.set()
            assert self.gate.wait(30), "the test never let the reading finish"
        return super().generate(question, as_of, passages)


def serve(client: TestClient, reader: CountingReader) -> CountingReader:
    client.app.state.answers.reader_state = ReaderState(reader)
    return reader


def key(question: str = "q", **changes) -> AnswerKey:
    values = dict(as_of=dt.date(2024, 1, 31), top_k=5, n_read=0, snapshot_id="s1", reader="r", retriever="d")
    return AnswerKey.of(question, **{**values, **changes})


def test_the_cache_keeps_the_most_recently_used_answers_and_counts_hits_and_stores():
    cache: AnswerCache[str] = AnswerCache(2)
    cache.put(key("a"), "A")
    cache.put(key("b"), "B")
    assert cache.get(key("a")) == "A"  # "a" is now the most recently used
    cache.put(key("c"), "C")  # two entries at most: "b" goes
    assert cache.get(key("b")) is None and cache.get(key("c")) == "C" and len(cache) == 2
    assert (cache.hits, cache.stores) == (2, 3)
    assert key("Who won  the\nfinal? ") == key("Who won the final?") != key("who won the final?")
    assert key(snapshot_id="s2") != key() != key(reader="gemma:v2") and key(retriever="d+rr") != key()
    off: AnswerCache[str] = AnswerCache(0)
    off.put(key("a"), "A")
    assert off.get(key("a")) is None and len(off) == 0 and off.stores == 0
    with pytest.raises(ValueError, match=">= 0"):
        AnswerCache(-1)


def test_a_question_asked_again_is_answered_from_the_cache_with_the_same_answer(client):
    reader = serve(client, CountingReader())
    first = client.post("/v1/answers", json=MAYOR).json()
    again = client.post("/v1/answers", json={**MAYOR, "question": "  Who is the mayor of   Port Calder?"}).json()
    assert reader.read == [MAYOR["question"]]  # read once
    assert first["cached"] is False and again["cached"] is True
    assert set(again["timings_ms"]) == {"queue", "cache", "total"} and again["timings_ms"]["queue"] == 0
    assert "read" in first["timings_ms"]
    same = ("answer", "as_of", "passages", "versions", "evidence", "grounded", "confidence", "notes")
    assert {f: again[f] for f in same} == {f: first[f] for f in same}

    # Anything the answer depends on asks the reader again.
    client.post("/v1/answers", json={**MAYOR, "as_of": "2024-01-30"})
    client.post("/v1/answers", json={**MAYOR, "top_k": 3})
    client.post("/v1/answers", json={**MAYOR, "question": "who is the mayor of Port Calder?"})
    assert len(reader.read) == 4
    other = serve(client, CountingReader(name="first-entity-v2"))  # a new reader version serves
    assert client.post("/v1/answers", json=MAYOR).json()["cached"] is False and len(other.read) == 1
    metrics = client.get("/metrics").text
    assert "sqa_answer_cache_hits_total 1.0" in metrics and "sqa_answer_cache_stores_total 5.0" in metrics
    assert "sqa_answer_cache_entries 5.0" in metrics
    # the hit is its lookup, not an answer's stages, and it took no turn at the gate
    assert 'sqa_answer_stage_seconds_count{stage="cache"} 1.0' in metrics
    assert 'sqa_answer_stage_seconds_count{stage="total"} 5.0' in metrics
    assert "sqa_answer_queue_wait_seconds_count 5.0" in metrics

    # A re-ranker activated (the retriever's name carries its version) reads again.
    service = client.app.state.answers
    service.retriever = Renamed(service.retriever, "+reranker-2024-02-01-abc123")
    assert client.post("/v1/answers", json=MAYOR).json()["cached"] is False and len(other.read) == 2


class Renamed:
    """A retriever under another name (as a re-ranker version appends its own), retrieving the same."""

    def __init__(self, base, suffix: str) -> None:
        self.base, self.name = base, base.name + suffix

    def __getattr__(self, attr):
        return getattr(self.base, attr)


def test_a_new_snapshot_is_read_again(client, wait_job):
    reader = serve(client, CountingReader())
    question = {"question": "Who is the mayor of Port Calder?"}  # as of today: the newest news
    assert client.post("/v1/answers", json=question).json()["cached"] is False
    assert client.post("/v1/answers", json=question).json()["cached"] is True
    old = client.get("/readyz").json()["snapshot"]
    job = wait_job(client, client.post("/admin/ingest", json={"month": "2024-02"}, headers=ADMIN).json()["job_id"])
    assert job["state"] == "succeeded", job
    deadline = time.monotonic() + 10
    while client.get("/readyz").json()["snapshot"] == old and time.monotonic() < deadline:
        time.sleep(0.05)
    answer = client.post("/v1/answers", json=question).json()
    assert answer["cached"] is False and answer["versions"]["index_snapshot"] != old
    assert len(reader.read) == 2


def test_a_cached_answer_takes_no_place_at_a_full_gate(make_settings):
    from tests.conftest import load_sample

    settings = make_settings(answer_concurrency=1, answer_queue=0, rate_limit="")
    load_sample(settings)
    with TestClient(create_app(settings)) as client:
        reader = serve(client, CountingReader())
        assert client.post("/v1/answers", json=MAYOR).json()["cached"] is False
        reader.gate = threading.Event()
        busy: list = []
        holder = threading.Thread(
            target=lambda: busy.append(client.post("/v1/answers", json={**MAYOR, "question": "Who runs the port?"}))
        )
        holder.start()
        try:
            assert reader.reading.wait(30)  # the one place is taken, and nobody may wait
            refused = client.post("/v1/answers", json={**MAYOR, "question": "Who won the regatta?"})
            assert refused.status_code == 503, refused.text
            hit = client.post("/v1/answers", json=MAYOR)
            assert hit.status_code == 200 and hit.json()["cached"] is True
        finally:
            reader.gate.set()
            holder.join(30)
        assert busy[0].status_code == 200


def test_the_ask_page_answers_from_the_cache_before_the_gate(make_settings):
    from tests.conftest import load_sample

    settings = make_settings(answer_concurrency=1, answer_queue=0, rate_limit="")
    load_sample(settings)
    page = {"q": MAYOR["question"], "as_of": "2024-01-31", "compare": "2024-01-10"}
    with TestClient(create_app(settings)) as client:
        reader = serve(client, CountingReader())
        first = client.get("/", params=page)
        assert first.status_code == 200 and len(reader.read) == 2  # both dates read
        assert "cache" not in first.text
        assert client.post("/v1/answers", json={**MAYOR, "as_of": "2024-01-10"}).json()["cached"] is True
        reader.gate = threading.Event()
        holder = threading.Thread(target=lambda: client.post("/v1/answers", json={**MAYOR, "question": "Who runs it?"}))
        holder.start()
        try:
            assert reader.reading.wait(30)  # the one place is taken, and nobody may wait
            again = client.get("/", params=page)
            assert again.status_code == 200 and "cache" in again.text  # its timings: the lookups
            refused = client.get("/", params={**page, "q": "Who won the regatta?"})
            assert refused.status_code == 503
        finally:
            reader.gate.set()
            holder.join(30)
        assert len(reader.read) == 3  # the page's second visit read nothing


def test_no_cache_when_it_is_off_and_none_for_a_pinned_snapshot(make_settings):
    from tests.conftest import load_sample

    settings = make_settings(answer_cache=0)
    load_sample(settings)
    with TestClient(create_app(settings)) as client:
        reader = serve(client, CountingReader())
        answers = [client.post("/v1/answers", json=MAYOR).json() for _ in range(2)]
        assert [a["cached"] for a in answers] == [False, False] and len(reader.read) == 2
        assert "sqa_answer_cache" not in client.get("/metrics").text

    with TestClient(create_app(make_settings())) as client:  # cache on: an evaluation pins its snapshot
        reader = serve(client, CountingReader())
        service = client.app.state.answers
        snapshot = service.index_state.current()
        for _ in range(2):
            service.answer(MAYOR["question"], dt.date(2024, 1, 31), snapshot=snapshot)
            service.answer(MAYOR["question"], dt.date(2024, 1, 31), index_as_of=dt.date(2024, 1, 15))
        assert len(reader.read) == 4 and len(service.cache) == 0
