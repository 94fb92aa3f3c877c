"""The answer gate: a bounded, time-limited waiting room instead of minute-long waits."""

from __future__ import annotations

import threading
import time

import pytest

from serving.admission import AdmissionGate, OverloadedError


def _hold(gate: AdmissionGate, release: threading.Event, done: list) -> threading.Thread:
    def run():
        try:
            with gate.admit():
                release.wait(10)
            done.append("ok")
        except OverloadedError as exc:
            done.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _until(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def _busy(max_waiting: int, max_wait_s: float):
    """A one-place gate whose place a background thread holds until `release` is set."""
    gate = AdmissionGate(max_active=1, max_waiting=max_waiting, max_wait_s=max_wait_s)
    release, done = threading.Event(), []
    holder = _hold(gate, release, done)
    _until(lambda: gate.active == 1)
    return gate, release, done, holder


def test_a_full_waiting_room_refuses_at_once_and_a_freed_slot_admits_the_next():
    gate, release, done, first = _busy(max_waiting=1, max_wait_s=10.0)
    second_release = threading.Event()
    second = _hold(gate, second_release, done)
    _until(lambda: gate.waiting == 1)
    t0 = time.monotonic()
    with pytest.raises(OverloadedError, match="1 questions are being answered and 1 are waiting") as refused:
        with gate.admit():
            pass
    assert time.monotonic() - t0 < 1.0  # refused at once, not after a wait
    assert refused.value.status_code == 503 and int(refused.value.headers["Retry-After"]) >= 1
    release.set()
    first.join(5)
    _until(lambda: gate.active == 1 and gate.waiting == 0)  # the second got the slot
    assert done == ["ok"] and gate.refused == 1
    second_release.set()
    second.join(5)
    assert done == ["ok", "ok"] and gate.active == 0


def test_a_wait_longer_than_the_limit_is_refused():
    gate, release, done, holder = _busy(max_waiting=5, max_wait_s=0.2)
    t0 = time.monotonic()
    with pytest.raises(OverloadedError, match=r"within 0\.\d s, .* within 0.2 s \(SQA_ANSWER_WAIT_S\)"):
        with gate.admit():
            pass
    assert 0.05 < time.monotonic() - t0 < 0.5  # the answer ahead has run as long: about half the limit
    assert gate.waiting == 0
    release.set()
    holder.join(5)
    with gate.admit():  # free again
        assert gate.active == 1
    assert gate.active == 0


def test_a_request_waits_only_as_long_as_leaves_time_to_answer_it_within_the_limit():
    gate, release, done, holder = _busy(max_waiting=5, max_wait_s=2.0)
    for took in (0.2, 0.3, 0.25):
        gate.timed(took)
    assert gate.answer_s() == pytest.approx(0.3, abs=0.1)  # the longest, the one in flight being younger
    t0 = time.monotonic()
    with pytest.raises(OverloadedError, match=r"within \d\.\d s, and an answer takes about \d\.\d s: .* within 2 s"):
        with gate.admit():
            pass
    waited = time.monotonic() - t0
    # the answer in flight has run about as long as this request waited: the request could start no
    # sooner than that answer's end and would take as long again, so it gives up near half the limit
    # (waiting the limit less the 0.3 s of the longest answer timed would have been 1.7 s)
    assert 0.8 <= waited < 1.5
    gate.timed(3.0)  # an answer took longer than the whole limit: nobody can wait at all now
    assert gate.wait_budget_s() == 0.0
    with pytest.raises(OverloadedError, match="within 0.0 s"):
        with gate.admit():
            pass
    release.set()
    holder.join(5)
    with gate.admit():  # a free place is taken at once, whatever the budget
        assert gate.active == 1
    assert gate.refused == 2


def test_a_cold_gate_learns_from_the_answers_in_flight():
    gate, release, done, holder = _busy(max_waiting=5, max_wait_s=2.0)  # nothing timed yet
    assert gate.wait_budget_s() > 1.8
    t0 = time.monotonic()
    with pytest.raises(OverloadedError, match="SQA_ANSWER_WAIT_S"):
        with gate.admit():
            pass
    assert 0.8 <= time.monotonic() - t0 < 1.5  # not the whole limit: the running answer takes that long too
    assert gate.answer_s() >= 0.8
    release.set()
    holder.join(5)
    assert gate.answer_s() == max(gate._recent) >= 0.8  # now timed


def test_the_answer_time_is_the_longest_of_the_last_twenty():
    gate = AdmissionGate(max_active=1, max_waiting=5, max_wait_s=5.0)
    assert gate.wait_budget_s() == 5.0  # nothing timed, nothing running
    gate.timed(8.0)  # a first answer that paid lazy loading counts too: waiting is off for a while
    assert gate.answer_s() == 8.0 and gate.wait_budget_s() == 0.0
    for _ in range(19):
        gate.timed(0.5)
    assert gate.answer_s() == 8.0  # still among the last 20
    gate.timed(2.0)
    assert gate.answer_s() == 2.0 and gate.wait_budget_s() == 3.0


def test_waiting_requests_are_served_first_come_first_served():
    gate, release, done, holder = _busy(max_waiting=5, max_wait_s=30.0)
    order: list[str] = []
    releases = {name: threading.Event() for name in "abc"}

    def waiter(name):
        with gate.admit():
            order.append(name)
            releases[name].wait(10)

    threads = []
    for n, name in enumerate("abc", start=1):
        threads.append(threading.Thread(target=waiter, args=(name,), daemon=True))
        threads[-1].start()
        _until(lambda n=n: gate.waiting == n)  # each in line before the next comes
    release.set()
    for name in "abc":
        _until(lambda name=name: name in order)
        assert order[-1] == name and gate.active == 1
        releases[name].set()
    for t in threads:
        t.join(5)
    assert order == ["a", "b", "c"] and gate.active == 0 and gate.waiting == 0


def test_time_spent_before_the_gate_comes_off_the_wait():
    gate, release, done, holder = _busy(max_waiting=5, max_wait_s=4.0)
    gate.timed(0.2)
    t0 = time.monotonic()
    with pytest.raises(OverloadedError, match=r"within [23]\.\d s"):
        with gate.admit(since=t0 - 2.0):  # the request arrived 2 s before it reached the gate
            pass
    assert 0.6 <= time.monotonic() - t0 < 1.7  # about (4 - 2) / 2: it and the answer ahead share what is left
    t1 = time.monotonic()
    with pytest.raises(OverloadedError, match=r"within 5\.\d s"):
        with gate.admit(since=t1 - 5.0):  # already past the limit: refused without waiting
            pass
    assert time.monotonic() - t1 < 0.2
    release.set()
    holder.join(5)


def test_admit_yields_the_time_from_arrival_until_the_place_was_given():
    gate, release, done, holder = _busy(max_waiting=5, max_wait_s=10.0)
    threading.Timer(0.3, release.set).start()
    arrived = time.monotonic() - 0.2  # the request arrived 0.2 s before it reached the gate
    with gate.admit(since=arrived) as queued_s:
        assert time.monotonic() - arrived >= queued_s >= 0.45  # 0.2 before the gate, about 0.3 in it
    holder.join(5)
    with gate.admit() as queued_s:  # a free place: no queue
        assert 0 <= queued_s < 0.5


def test_the_gate_rejects_nonsense_limits():
    with pytest.raises(ValueError, match="max_active 0"):
        AdmissionGate(max_active=0, max_waiting=1, max_wait_s=1)
    with pytest.raises(ValueError, match="must not be negative"):
        AdmissionGate(max_active=1, max_waiting=-1, max_wait_s=1)


def test_the_api_answers_busy_with_503_and_retry_after_but_bad_input_with_422(make_settings, sample_root):
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import load_sample

    settings = make_settings(answer_concurrency=1, answer_queue=0)
    load_sample(settings, through="2024-01")
    with TestClient(create_app(settings)) as client:
        service = client.app.state.answers
        gate = client.app.state.answer_gate
        release = threading.Event()
        original = service.answer

        def slow_answer(*args, **kwargs):
            release.wait(10)
            return original(*args, **kwargs)

        service.answer = slow_answer
        body = {"question": "Who is the mayor of Port Calder?", "as_of": "2024-01-20"}
        first: list = []
        thread = threading.Thread(target=lambda: first.append(client.post("/v1/answers", json=body)), daemon=True)
        thread.start()
        _until(lambda: gate.active == 1)
        busy = client.post("/v1/answers", json=body)
        assert busy.status_code == 503 and "the server is busy" in busy.json()["detail"]
        assert int(busy.headers["retry-after"]) >= 1
        assert client.post("/v1/answers", json={**body, "question": " "}).status_code == 422  # not queued
        page = client.get("/", params={"q": body["question"], "as_of": body["as_of"]})
        assert page.status_code == 503 and "the server is busy" in page.text and "retry-after" in page.headers
        release.set()
        thread.join(10)
        assert first[0].status_code == 200 and first[0].json()["passages"]
        assert client.post("/v1/answers", json=body).status_code == 200
