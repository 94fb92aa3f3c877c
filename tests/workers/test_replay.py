"""Replay and evaluation on the cup stream (tests/workers/conftest.py): one cup final a month, each
won by someone new, and a question at the end of each month. The index of the quarter before cannot know the
winner; the index of the question's own quarter can; a later index adds nothing (time filter)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap.builders import build_answer_service, build_encoder, build_reader, open_database
from app.bootstrap.job_configs import ingest_config
from app.main import create_app
from store.tables import EvalResult, EvalRun, IndexSnapshot
from workers.config import EvalConfig
from workers.evaluate import evaluate_current
from workers.imports import store_records
from workers.replay import ReplayPlan, run_replay


@pytest.fixture
def replayed(settings, cup_stream):
    db = open_database(settings)
    store_records(db.sessions, *cup_stream)
    service = build_answer_service(settings, db, build_encoder(settings), build_reader(settings))
    cfg = EvalConfig(top_k=5, reader_passages=1)
    run_id = run_replay(
        db.sessions, service, ingest_config(settings), ReplayPlan("2023-10", "2024-03"), cfg, settings.reports_dir
    )
    yield settings, db, service, cfg, run_id
    db.close()


def test_replay_grid_shows_the_index_update_and_no_future_leak(replayed):
    settings, db, _, _, run_id = replayed
    with db.sessions() as s:
        run = s.get(EvalRun, run_id)
        rows = s.scalars(select(EvalResult).where(EvalResult.run_id == run_id)).all()
        quarter_states = s.scalars(select(IndexSnapshot.label).where(IndexSnapshot.kind == "quarter")).all()
    assert run.state == "succeeded"
    assert sorted(quarter_states) == ["2023Q3", "2023Q4", "2024Q1"]
    assert len(rows) == 6 * 3  # six questions, three quarter-end states
    lag = {}
    for r in rows:
        d = (
            int(r.state_quarter[:4]) * 4
            + int(r.state_quarter[5])
            - (int(r.test_quarter[:4]) * 4 + int(r.test_quarter[5]))
        )
        lag.setdefault(d, []).append(r)
    assert {r.recall for r in lag[-1]} == {0.0}  # the index of the quarter before cannot know the winner
    assert {r.recall for r in lag[0]} == {1.0}
    assert all(r.f1 == 1.0 for r in lag[0])  # first-entity copies the winner's name
    by_q = {(r.question_id, r.state_quarter): r for r in rows}
    for r in lag[1]:  # a later index adds nothing the question's date may see
        same = by_q[(r.question_id, r.test_quarter)]
        assert (r.answer, r.recall, r.passages) == (same.answer, same.recall, same.passages)
    f1 = run.summary["by_subset"]["all"]["f1"]
    assert f1["lag_table"]["-1"] == 0.0 and f1["lag_table"]["0"] == 1.0
    assert f1["adaptation"]["score"] > 0
    assert 0.0 <= f1["adaptation"]["p_value"] <= 1.0
    assert (settings.reports_dir / f"run-{run_id}" / "report.html").exists()


def test_replay_resumes_without_answering_again(replayed):
    settings, db, service, cfg, run_id = replayed
    with db.sessions() as s, s.begin():  # as if the run had died half-way
        first = s.scalars(select(EvalResult).where(EvalResult.run_id == run_id).order_by(EvalResult.id)).all()
        for r in first[10:]:
            s.delete(r)
        s.get(EvalRun, run_id).state = "failed"
    calls = []
    original = service.answer
    service.answer = lambda *a, **k: calls.append(a) or original(*a, **k)
    again = run_replay(
        db.sessions, service, ingest_config(settings), ReplayPlan("2023-10", "2024-03"), cfg, settings.reports_dir
    )
    assert again == run_id
    assert 0 < len(calls) <= 8  # only the eight missing rows (fewer: later states reuse earlier answers)
    with db.sessions() as s:
        assert s.scalar(select(func.count()).select_from(EvalResult).where(EvalResult.run_id == run_id)) == 18
        assert s.get(EvalRun, run_id).state == "succeeded"


def test_quarterly_evaluation_uses_the_serving_index(replayed):
    settings, db, service, cfg, _ = replayed
    run_id = evaluate_current(db.sessions, service, "2024Q1", cfg, settings.reports_dir)
    with db.sessions() as s:
        run = s.get(EvalRun, run_id)
        rows = s.scalars(select(EvalResult).where(EvalResult.run_id == run_id)).all()
    assert run.kind == "quarterly" and run.params["quarter"] == "2024Q1"
    assert len(rows) == 3 and all(r.recall == 1.0 and r.subset == "recent" for r in rows)
    assert all(r.days == 5.0 for r in rows)  # cited passage five days before its question


def test_quarterly_evaluation_rejects_a_bad_quarter(replayed):
    settings, db, service, cfg, _ = replayed
    with pytest.raises(ValueError, match="is not a quarter"):
        evaluate_current(db.sessions, service, "2024Q5", cfg, settings.reports_dir)


def test_evaluation_routes(replayed):
    settings, _, _, _, run_id = replayed
    headers = {"X-Admin-Token": "test-admin-token"}
    with TestClient(create_app(settings)) as c:
        assert c.get("/admin/evaluations").status_code == 401
        runs = c.get("/admin/evaluations", headers=headers).json()
        assert runs[0]["id"] == run_id and runs[0]["results"] == 18
        one = c.get(f"/admin/evaluations/{run_id}", headers=headers).json()
        assert one["summary"]["by_subset"]["all"]["recall"]["lag_table"]["0"] == 1.0
        report = c.get(f"/admin/evaluations/{run_id}/report", headers=headers)
        assert report.status_code == 200 and "data:image/png;base64," in report.text
        assert c.get("/admin/evaluations/999", headers=headers).status_code == 404
        bad = c.post("/admin/evaluations", json={"quarter": "2024-Q1"}, headers=headers)
        assert bad.status_code == 422 and "is not a quarter" in bad.json()["detail"]


class _SureReader:
    """The fake reader, with a confidence: high when it read something, low when it read nothing."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def generate(self, question, as_of, passages):
        from models.reader_base import ReaderAnswer

        answer = self.inner.generate(question, as_of, passages)
        return ReaderAnswer(answer.text, answer.raw, confidence=0.9 if passages else 0.1)


def test_an_evaluation_stores_how_far_each_answer_can_be_trusted_and_reports_it(replayed):
    settings, db, _, cfg, _ = replayed
    service = build_answer_service(settings, db, build_encoder(settings), _SureReader(build_reader(settings)))
    run_id = evaluate_current(db.sessions, service, "2024Q1", cfg, settings.reports_dir)
    with db.sessions() as s:
        run = s.get(EvalRun, run_id)
        rows = s.scalars(select(EvalResult).where(EvalResult.run_id == run_id)).all()
    assert len(rows) == 3 and all(r.em == 1.0 for r in rows)
    assert {(r.grounded, r.confidence) for r in rows} == {(True, 0.9)}  # the winner's name is in the passage read
    trust = run.summary["trust"]
    assert set(trust) == {"2024Q1", "all"} and trust["all"] == trust["2024Q1"]
    assert trust["all"]["answers"] == 3
    assert trust["all"]["grounded"] == {"share": 100.0, "n": 3, "em_grounded": 100.0, "em_otherwise": 0.0}
    high = trust["all"]["confidence"]["bands"][0]
    assert (high["band"], high["n"], high["em"]) == ("high", 3, 100.0) and trust["all"]["confidence"]["auc"] is None
    report = (settings.reports_dir / f"run-{run_id}" / "report.html").read_text()
    assert "How far to trust the answers" in report and "100.0%, EM 100.0" in report
    section = report.split('<h2 id="trust">', 1)[1].split("<h2", 1)[0]
    assert "<td>2024Q1</td><td>3</td>" in section and "<td>all</td>" not in section  # one quarter: no "all" row again


def test_retrieval_only_rows_and_a_reader_without_confidence_store_nulls(replayed):
    settings, db, _, _, run_id = replayed  # the fake reader gives no confidence
    with db.sessions() as s:
        rows = s.scalars(select(EvalResult).where(EvalResult.run_id == run_id)).all()
        summary = s.get(EvalRun, run_id).summary
    assert {r.confidence for r in rows} == {None}
    assert {r.grounded for r in rows if r.em == 1.0} == {True}
    assert summary["trust"]["all"]["confidence"] == {}
    # each test quarter judged under its own quarter's state: every answer right there
    assert {q: t["grounded"]["em_grounded"] for q, t in summary["trust"].items()} == {
        "2023Q4": 100.0,
        "2024Q1": 100.0,
        "all": 100.0,
    }
