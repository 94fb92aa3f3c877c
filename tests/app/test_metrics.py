"""The operator's `sqa_` metrics at /metrics (app/api/operator_metrics.py)."""

from __future__ import annotations

import logging
import threading

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

QUESTION = "Who is the mayor of Port Calder?"


def _samples(client) -> dict[tuple[str, tuple], float]:
    """/metrics as {(sample name, sorted labels): value}; asserts it answered 200."""
    r = client.get("/metrics")
    assert r.status_code == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def _names(samples) -> set[str]:
    return {name for name, _ in samples}


def test_metrics_show_the_answer_stages_the_gate_the_index_freshness_ingest_and_jobs(client):
    assert client.post("/v1/answers", json={"question": QUESTION, "as_of": "2024-01-31"}).status_code == 200
    m = _samples(client)
    snap = client.app.state.answers.index_state.current()

    for stage in ("retrieve", "read", "total"):  # one answered question: one observation a stage
        assert m[("sqa_answer_stage_seconds_count", (("stage", stage),))] == 1
    assert m[("sqa_answer_stage_seconds_sum", (("stage", "total"),))] > 0
    assert m[("sqa_answer_queue_wait_seconds_count", ())] == 1
    assert m[("sqa_answers_running", ())] == 0 and m[("sqa_answers_waiting", ())] == 0
    assert m[("sqa_answer_concurrency_limit", ())] == client.app.state.answer_gate.max_active
    assert m[("sqa_answer_refusals_total", (("reason", "queue_full"),))] == 0
    assert m[("sqa_answer_refusals_total", (("reason", "wait_budget"),))] == 0

    assert m[("sqa_index_vectors", ())] == snap.index.ntotal == snap.manifest.total > 0
    assert m[("sqa_index_shards", ())] == len(snap.manifest.shards) == 3  # the sample through 2024-03
    assert m[("sqa_index_snapshot", (("snapshot_id", snap.snapshot_id),))] == 1
    assert 0 <= m[("sqa_index_snapshot_age_seconds", ())] < 3600

    assert m[("sqa_newest_article_age_seconds", ())] > 0
    assert m[("sqa_live_articles_waiting", ())] == 0
    assert m[("sqa_ingest_passages_per_second", ())] > 0
    assert m[("sqa_jobs", (("kind", "ingest"), ("state", "succeeded")))] == 1
    assert "http_requests_total" in _names(m)  # the per-route counts are still there


def test_the_ask_page_counts_each_date_it_answers_in_its_one_turn(client):
    r = client.get("/", params={"q": QUESTION, "as_of": "2024-02-28", "compare": "2024-01-10"})
    assert r.status_code == 200
    m = _samples(client)
    assert m[("sqa_answer_stage_seconds_count", (("stage", "total"),))] == 2
    assert m[("sqa_answer_queue_wait_seconds_count", ())] == 1


def test_a_refused_answer_is_counted_by_reason(client):
    gate = client.app.state.answer_gate
    held, release = threading.Event(), threading.Event()

    def hold():
        with gate.admit():
            held.set()
            release.wait(10)

    old_waiting, gate.max_waiting = gate.max_waiting, 0  # no waiting room: the next is refused at once
    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5)
        m = _samples(client)
        assert m[("sqa_answers_running", ())] == 1
        assert client.post("/v1/answers", json={"question": QUESTION}).status_code == 503
    finally:
        release.set()
        holder.join(5)
        gate.max_waiting = old_waiting
    m = _samples(client)
    assert m[("sqa_answer_refusals_total", (("reason", "queue_full"),))] == 1
    assert ("sqa_answer_stage_seconds_count", (("stage", "total"),)) not in m  # nothing was answered


def test_a_failing_query_leaves_its_family_out_and_metrics_200(client, caplog):
    client.get("/healthz")
    with client.app.state.db.sessions() as session, session.begin():
        session.execute(text("ALTER TABLE live_queue RENAME TO live_queue_gone"))
    try:
        with caplog.at_level(logging.ERROR, logger="app.api.operator_metrics"):
            m = _samples(client)
    finally:
        with client.app.state.db.sessions() as session, session.begin():
            session.execute(text("ALTER TABLE live_queue_gone RENAME TO live_queue"))
    names = _names(m)
    assert "sqa_live_articles_waiting" not in names and "sqa_newest_article_age_seconds" not in names
    assert "could not compute the freshness metrics" in caplog.text
    # the queries after it still run (on PostgreSQL only once the failed transaction is rolled back)
    assert m[("sqa_jobs", (("kind", "ingest"), ("state", "succeeded")))] == 1
    assert "sqa_ingest_passages_per_second" in names and "sqa_index_vectors" in names
    assert "http_requests_total" in names


def test_the_gate_counts_its_refusals_by_reason():
    from serving.admission import AdmissionGate, OverloadedError

    gate = AdmissionGate(max_active=1, max_waiting=1, max_wait_s=0.1)
    assert gate.refusals() == {"queue_full": 0, "wait_budget": 0}
    with gate.admit(), pytest.raises(OverloadedError, match="SQA_ANSWER_WAIT_S"):
        with gate.admit():  # waits, and no place frees within 0.1 s
            pass
    assert gate.refusals() == {"queue_full": 0, "wait_budget": 1} and gate.refused == 1
