"""The evaluation list's pooled scores: each subset weighs by the rows that carry the score."""

from __future__ import annotations

import datetime as dt

import pytest

from app.bootstrap.builders import open_database
from app.web.dashboard_evaluations import _scored
from store.tables import EvalResult, EvalRun, Question


def test_a_pooled_score_weighs_each_subset_by_its_scored_rows(sqlite_settings):
    db = open_database(sqlite_settings)
    try:
        with db.sessions() as session, session.begin():
            qs = [
                Question(
                    qid=f"q{i}",
                    text="Who?",
                    asked=dt.date(2023, 4, 10),
                    answers=["x"],
                    choices=[],
                    subset="test",
                    meta={},
                )
                for i in range(5)
            ]
            run = EvalRun(kind="quarterly", params={"quarter": "2023Q2"})
            session.add_all([*qs, run])
            session.flush()

            def res(q, subset, grounded, em):
                return EvalResult(
                    run_id=run.id,
                    question_id=q.id,
                    test_quarter="2023Q2",
                    state_quarter="2023Q2",
                    snapshot_id="s",
                    subset=subset,
                    answer=None if em is None else "x",
                    em=em,
                    f1=em,
                    recall=1.0,
                    grounded=grounded,
                )

            # recent: one row, grounded and right; past: four rows, one grounded (wrong), three without
            # a grounded flag (evaluated before it was kept) and one of those retrieval only (no EM)
            session.add_all(
                [
                    res(qs[0], "recent", True, 1.0),
                    res(qs[1], "past", False, 0.0),
                    res(qs[2], "past", None, 0.0),
                    res(qs[3], "past", None, 1.0),
                    res(qs[4], "past", None, None),
                ]
            )
        with db.sessions() as session:
            [scored] = _scored(session, [session.get(EvalRun, run.id)])
    finally:
        db.close()
    assert scored["n"] == 5 and scored["recall"] == 1.0
    assert scored["subsets"]["past"]["grounded"] == 0.0 and scored["subsets"]["recent"]["grounded"] == 1.0
    # grounded over the two rows that say: one of two, not one of five
    assert scored["grounded"] == pytest.approx(0.5)
    # EM over the four answered rows: two of four
    assert scored["em"] == pytest.approx(0.5) and scored["f1"] == pytest.approx(0.5)
