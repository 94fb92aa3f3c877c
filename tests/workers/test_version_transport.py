"""Transportability and drift predictions from stored evaluation results and month profiles."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from app.bootstrap.builders import build_answer_service, build_encoder, build_reader, open_database
from app.bootstrap.job_configs import ingest_config
from app.cli import cli
from evaluation.drift import profile_vectors
from settings import get_settings
from store.tables import EvalResult, EvalRun, Question
from workers.config import EvalConfig
from workers.evaluate import evaluate_current
from workers.imports import store_records
from workers.ingest import ingest
from workers.version_transport import MonthScores, month_scores, predicted_drop, transport_summary, version_key


def _question(session, qid: str, asked: dt.date) -> int:
    q = Question(qid=qid, text="Who?", asked=asked, answers=["x"], choices=[], subset="test", meta={})
    session.add(q)
    session.flush()
    return q.id


def test_month_scores_count_each_question_once_per_version_at_lag_zero_or_later(sqlite_settings):
    db = open_database(sqlite_settings)
    try:
        with db.sessions() as session, session.begin():
            a = _question(session, "a", dt.date(2023, 1, 10))
            b = _question(session, "b", dt.date(2023, 2, 10))
            c = _question(session, "c", dt.date(2023, 4, 10))
            params = {"reader": "r1", "encoder": "e"}
            run1, run2 = EvalRun(kind="quarterly", params=params), EvalRun(kind="replay", params=params)
            other = EvalRun(kind="quarterly", params={"reader": "r2", "encoder": "e"})
            session.add_all([run1, run2, other])
            session.flush()

            def res(run, qid, test, state, f1):
                return EvalResult(
                    run_id=run.id,
                    question_id=qid,
                    test_quarter=test,
                    state_quarter=state,
                    snapshot_id="s",
                    subset="recent",
                    answer="x",
                    em=f1,
                    f1=f1,
                    recall=1.0,
                )

            session.add_all(
                [
                    res(run1, a, "2023Q1", "2023Q1", 1.0),
                    res(run1, b, "2023Q1", "2023Q1", 0.5),
                    res(run2, a, "2023Q1", "2023Q2", 0.0),  # the same question again: ignored
                    res(run2, c, "2023Q2", "2023Q1", 1.0),  # an older index (lag -1): ignored
                    res(run2, c, "2023Q2", "2023Q2", 0.25),
                    res(other, a, "2023Q1", "2023Q1", 0.0),
                ]
            )
        with db.sessions() as session:
            scores = month_scores(session)
    finally:
        db.close()
    assert set(scores) == {version_key({"reader": "r1", "encoder": "e"}), "r2 @ e"}
    mine = scores["r1 @ e"]
    assert mine["2023-01"] == MonthScores(100.0, 1)
    assert mine["2023-02"] == MonthScores(50.0, 1)
    assert mine["2023-04"] == MonthScores(25.0, 1)
    assert scores["r2 @ e"]["2023-01"] == MonthScores(0.0, 1)


def _profiles(shift: dict[str, float]):
    rng = np.random.default_rng(0)
    out = {}
    for month, s in shift.items():
        v = rng.normal(0, 0.05, (50, 8))
        v[:, 0] += 1.0
        v[:, 1] += s
        out[month] = profile_vectors(month, v, encoder="fake")
    return out


def test_transport_summary_predicts_later_quarters_from_drift():
    profiles = _profiles(
        {"2023-01": 0.0, "2023-02": 0.0, "2023-03": 0.0, "2023-04": 0.5, "2023-05": 0.5, "2023-06": 0.5, "2023-07": 1.0}
    )
    scores = {
        "2023-01": MonthScores(400.0, 10),
        "2023-02": MonthScores(400.0, 10),
        "2023-03": MonthScores(400.0, 10),
        "2023-04": MonthScores(300.0, 10),
        "2023-05": MonthScores(300.0, 10),
        "2023-06": MonthScores(300.0, 10),
    }
    t = transport_summary(scores, profiles.get, extra_months=["2023-07"])
    assert t["source"] == "2023Q1" and t["source_months"] == ["2023-01", "2023-02", "2023-03"]
    assert t["quarters"]["2023Q1"]["f1"] == pytest.approx(40.0)
    assert t["transport"]["tau_p"]["2023Q2"] == pytest.approx(0.75)
    preds = {r["quarter"]: r for r in t["predictions"]}
    assert preds["2023Q2"]["actual_f1"] == pytest.approx(30.0)
    assert preds["2023Q3"]["actual_f1"] is None
    # Q3 drifts further than Q2, which lost 10 points: the regression predicts a bigger loss.
    assert preds["2023Q3"]["predicted_f1"] < 30.0
    drop = predicted_drop(scores, profiles.get, "2023-07")
    assert drop["predicted_drop"] > 10.0 and drop["source"] == "2023Q1"
    with pytest.raises(ValueError, match="no drift profile"):
        transport_summary(scores, lambda m: None)
    with pytest.raises(ValueError, match="not available"):
        transport_summary(scores, profiles.get, measure="unseen_entities")


@pytest.fixture
def evaluated(make_settings, cup_stream, monkeypatch):
    """The cup stream of test_replay ingested, with 2023Q4 and 2024Q1 evaluated (first-entity reader)."""
    settings = make_settings()
    db = open_database(settings)
    try:
        store_records(db.sessions, *cup_stream)
        ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2024-03"})
        service = build_answer_service(settings, db, build_encoder(settings), build_reader(settings))
        for quarter in ("2023Q4", "2024Q1"):
            evaluate_current(db.sessions, service, quarter, EvalConfig(), settings.reports_dir)
    finally:
        db.close()
    monkeypatch.setenv("SQA_HOME", str(settings.home))
    monkeypatch.setenv("SQA_ENCODER", "hash")
    monkeypatch.setenv("SQA_READER", "first-entity")
    monkeypatch.delenv("SQA_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    yield settings
    get_settings.cache_clear()


def test_cli_transport_prints_tau_and_predictions(evaluated, tmp_path):
    out = tmp_path / "transport.json"
    r = CliRunner().invoke(cli, ["transport", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "tau_p mean" in r.output and "2024Q1" in r.output
    result = json.loads(out.read_text())
    (version,) = result
    t = result[version]
    assert t["source"] == "2023Q4" and t["quarters"]["2024Q1"]["n"] == 3
    (pred,) = t["predictions"]
    assert pred["quarter"] == "2024Q1" and pred["actual_f1"] is not None
    bad = CliRunner().invoke(cli, ["transport", "--version", "nobody @ nothing"])
    assert bad.exit_code == 2 and "no evaluated questions" in bad.output


def _activate_fake_version(settings, reader_name_in_runs: str):
    """An active reader_models row, and the stored evaluation runs relabelled as answered by it."""

    from store.tables import ReaderModel

    db = open_database(settings)
    with db.sessions() as session, session.begin():
        session.add(ReaderModel(version="v1", kind="extractive", path="v1", state="ready", active=True, metrics={}))
        for run in session.query(EvalRun).all():
            run.params = {**run.params, "reader": reader_name_in_runs}
    return db


def test_on_drift_decision_compares_the_predicted_drop_with_the_threshold(evaluated):
    from app.bootstrap import build_context
    from serving.reader_registry import active_version
    from workers.after_ingest import drift_decision

    db = _activate_fake_version(evaluated, "extractive:v1")
    try:
        with db.sessions() as session:
            active = active_version(session)
            lenient = drift_decision(
                build_context(evaluated.model_copy(update={"drift_drop_threshold": 1000.0}), db),
                session,
                active,
                "2024-03",
            )
            strict = drift_decision(
                build_context(evaluated.model_copy(update={"drift_drop_threshold": 0.0}), db),
                session,
                active,
                "2024-03",
            )
    finally:
        db.close()
    assert lenient["finetune"] is False and "is within the threshold 1000.00" in lenient["reason"]
    drop = strict["prediction"]["predicted_drop"]
    assert strict["finetune"] is (drop > 0.0)
    assert lenient["prediction"]["month"] == "2024-03" and lenient["prediction"]["source"] == "2023Q4"


def test_on_drift_decision_needs_an_evaluated_version(evaluated):
    from app.bootstrap import build_context
    from serving.reader_registry import active_version
    from workers.after_ingest import drift_decision

    db = _activate_fake_version(evaluated, "first-entity")  # runs answered by another reader
    try:
        with db.sessions() as session:
            decision = drift_decision(build_context(evaluated, db), session, active_version(session), "2024-03")
    finally:
        db.close()
    assert decision["finetune"] is False and "extractive:v1 has none yet" in decision["reason"]


def test_quarterly_report_shows_drift_and_predicted_against_measured(evaluated, tmp_path):
    from app.bootstrap.job_configs import eval_config
    from workers.evaluate import render_report

    db = open_database(evaluated)
    try:
        with db.sessions() as session:
            run_id = max(r.id for r in session.query(EvalRun).all())
        _, files = render_report(db.sessions, run_id, tmp_path / "report", "test", eval_config(evaluated))
        _, plain = render_report(db.sessions, run_id, tmp_path / "plain", "test")
    finally:
        db.close()
    html = files["html"].read_text()
    assert "Drift and transportability" in html and "Predicted (before answering)" in html
    transport = json.loads(files["summary"].read_text())["transport"]
    assert transport["source"] == "2023Q4" and [r["quarter"] for r in transport["predictions"]] == ["2024Q1"]
    assert "Drift and transportability" not in plain["html"].read_text()
