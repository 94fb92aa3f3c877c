"""What follows an ingest (workers/after_ingest.py): auto-train when it is on, then the fine-tune
policy, each a job of its own or a reasoned skip. The reader jobs themselves are faked here
(tests/workers/test_auto_train.py and test_train.py run them)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from unittest.mock import patch

import pytest
from sqlalchemy import select

from app.bootstrap import open_context
from store.tables import Job
from tests.gemma_runs import register_reader
from workers import after_ingest
from workers.after_ingest import (
    AUTO_TRAIN_OFF,
    NO_ACTIVE_READER,
    NO_EVALUATION,
    NO_TRAIN,
    RANKER_REFIT,
    train_after_ingest,
)
from workers.config import AutoTrainConfig

MARCH = dt.date(2024, 3, 1)
OFF = AutoTrainConfig(enabled=False)
PINNED = AutoTrainConfig(enabled=True, rerank=False)  # the tests' reader is pinned: auto-train has nothing to do


@pytest.fixture
def ctx(sqlite_settings):
    with open_context(sqlite_settings) as context:
        yield context


def use(ctx, *, policy: str = "never", auto: AutoTrainConfig = OFF):
    return dataclasses.replace(ctx, finetune_policy=policy, auto_train=auto)


def activate(ctx, version: str, kind: str = "gemma") -> None:
    register_reader(ctx, version, kind, dt.date(2024, 2, 1))


def jobs(ctx) -> list[tuple[str, str]]:
    with ctx.sessions() as session:
        return [(j.kind, j.state) for j in session.scalars(select(Job).order_by(Job.id))]


def fake_finetune(calls: list, *, fail: bool = False):
    def run_finetune_job(ctx, job, *, month):
        calls.append(month)
        if fail:
            raise RuntimeError("out of memory")
        return "gemma-tuned"

    return patch("workers.train.run_finetune_job", side_effect=run_finetune_job)


def test_train_after_ingest_does_nothing_when_everything_is_off(ctx):
    done = train_after_ingest(use(ctx), MARCH)
    assert done == {
        "auto_train": {"action": "off", "reason": AUTO_TRAIN_OFF},
        "finetune": {"policy": "never", "ran": False},
    }
    assert jobs(ctx) == []


def test_train_after_ingest_with_no_train_trains_nothing_whatever_the_settings(ctx):
    activate(ctx, "gemma-old")
    calls: list = []
    with fake_finetune(calls):
        done = train_after_ingest(use(ctx, policy="always", auto=PINNED), MARCH, train=False)
    assert done["auto_train"] == {"action": "off", "reason": NO_TRAIN}
    assert done["finetune"] == {"policy": "always", "ran": False, "reason": NO_TRAIN}
    assert calls == [] and jobs(ctx) == []


def test_train_after_ingest_of_an_empty_month_says_so(ctx):
    done = train_after_ingest(use(ctx, policy="always", auto=PINNED), MARCH, indexed=False)
    assert done["auto_train"] == {"action": "skip", "reason": "no articles in 2024-03"}
    assert done["finetune"] == {"policy": "always", "ran": False, "reason": "no articles in 2024-03"}


def test_train_after_ingest_records_no_job_when_auto_train_has_nothing_to_do(ctx):
    told: list = []
    done = train_after_ingest(use(ctx, auto=PINNED), MARCH, on_train=lambda *a: told.append(a))
    auto = done["auto_train"]
    assert auto["action"] == "skip" and "SQA_READER=first-entity pins the reader" in auto["reason"]
    assert "job_id" not in auto and told == [] and jobs(ctx) == []


def test_train_after_ingest_hands_its_budget_and_cut_to_auto_train(ctx):
    seen: list = []

    def run_after_ingest(ctx, until, cfg, *, keep_going):
        seen.append((until, cfg.max_minutes, keep_going))
        return {"action": "train", "job_id": 7}

    told: list = []
    with (
        patch.object(after_ingest, "nothing_to_do", return_value=None),
        patch.object(after_ingest, "run_after_ingest", side_effect=run_after_ingest),
    ):
        done = train_after_ingest(
            use(ctx, auto=PINNED), MARCH, train_minutes=2.5, keep_going=False, on_train=lambda u, c: told.append(u)
        )
    assert done["auto_train"] == {"action": "train", "job_id": 7}
    assert seen == [(MARCH, 2.5, False)] and told == [MARCH]  # said before it started


@pytest.mark.parametrize("policy", ["always", "on-drift"])
def test_the_policy_needs_an_active_reader_that_is_not_a_ranker(ctx, policy):
    assert train_after_ingest(use(ctx, policy=policy), MARCH)["finetune"] == {
        "policy": policy,
        "ran": False,
        "reason": NO_ACTIVE_READER,
    }
    activate(ctx, "ranker-1", kind="ranker")
    assert train_after_ingest(use(ctx, policy=policy), MARCH)["finetune"]["reason"] == RANKER_REFIT
    assert jobs(ctx) == []


def test_policy_always_fine_tunes_the_active_reader_on_the_month_as_a_job(ctx):
    activate(ctx, "gemma-old")
    calls: list = []
    with fake_finetune(calls):
        done = train_after_ingest(use(ctx, policy="always"), MARCH)
    tune = done["finetune"]
    assert tune["policy"] == "always" and tune["ran"] and tune["version"] == "gemma-tuned"
    assert calls == ["2024-03"] and jobs(ctx) == [("finetune", "succeeded")]


def test_a_failed_fine_tune_is_on_its_job_and_raised_only_without_keep_going(ctx):
    activate(ctx, "gemma-old")
    with fake_finetune([], fail=True):
        kept = train_after_ingest(use(ctx, policy="always"), MARCH)
        assert kept["finetune"]["error"] == "out of memory" and kept["finetune"]["ran"]
        with pytest.raises(RuntimeError, match="out of memory"):
            train_after_ingest(use(ctx, policy="always"), MARCH, keep_going=False)
    assert jobs(ctx) == [("finetune", "failed"), ("finetune", "failed")]


def test_policy_on_drift_fine_tunes_only_when_the_predicted_drop_says_so(ctx):
    activate(ctx, "gemma-old")
    never_evaluated = train_after_ingest(use(ctx, policy="on-drift"), MARCH)["finetune"]
    assert never_evaluated == {
        "policy": "on-drift",
        "ran": False,
        "finetune": False,
        "reason": NO_EVALUATION.format(name="gemma:gemma-old"),
    }
    calls: list = []
    drift = {"finetune": True, "reason": "predicted F1 drop 9.00 exceeds the threshold 5.00"}
    with fake_finetune(calls), patch.object(after_ingest, "drift_decision", return_value=drift):
        tune = train_after_ingest(use(ctx, policy="on-drift"), MARCH)["finetune"]
    assert tune["ran"] and tune["version"] == "gemma-tuned" and tune["reason"] == drift["reason"]
    assert calls == ["2024-03"] and jobs(ctx) == [("finetune", "succeeded")]


def test_the_result_is_kept_on_the_ingest_job_it_followed(ctx):
    job_id = ctx.runner.create("ingest", {"month": "2024-03"})
    done = train_after_ingest(use(ctx), MARCH, record_on=job_id)
    assert ctx.runner.get(job_id).counts == {"after_ingest": done}
