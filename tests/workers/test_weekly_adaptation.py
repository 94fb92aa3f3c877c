"""The weekly adaptation (workers.scheduled.weekly_adaptation): the after-ingest training run at a
cut of any day, checked on the days before the cut instead of the month before; a fine-tune learns
that week only; a cut runs once; the scheduler lists it only when SQA_ADAPT_CRON is set; bad cuts
are refused with a message."""

from __future__ import annotations

import dataclasses
import datetime as dt
from unittest.mock import patch

import pytest

from app.bootstrap import open_context
from app.bootstrap.job_configs import scheduler_config
from serving.errors import InvalidInputError
from store.tables import Job
from tests.gemma_runs import register_reader
from workers import scheduled
from workers.auto_train import after_ingest, held_back_period, plan
from workers.config import AutoTrainConfig
from workers.scheduler import job_specs

CUT = dt.date(2024, 3, 11)


def test_the_held_back_period_is_the_month_before_or_the_days_before_the_cut():
    assert held_back_period(dt.date(2024, 3, 1)) == (dt.date(2024, 2, 1), "2024-02")
    assert held_back_period(CUT) == (dt.date(2024, 3, 1), "2024-03")  # a mid-month cut: its own month so far
    assert held_back_period(CUT, 7) == (dt.date(2024, 3, 4), "2024-03-04..2024-03-10")
    assert held_back_period(dt.date(2024, 3, 3), 7) == (dt.date(2024, 2, 25), "2024-02-25..2024-03-02")
    with pytest.raises(ValueError, match="held-back days must be 0"):
        held_back_period(CUT, -1)


def test_plan_at_a_weekly_cut(loaded_settings):
    with open_context(loaded_settings) as ctx:
        ctx = dataclasses.replace(ctx, reader="auto")
        assert plan(ctx, CUT, 7) == {"action": "train", "held_back": "2024-03-04..2024-03-10"}
        register_reader(ctx, "gemma-feb", "gemma", dt.date(2024, 2, 29))
        assert plan(ctx, CUT, 7) == {"action": "finetune", "parent": "gemma-feb", "held_back": "2024-03-04..2024-03-10"}
        register_reader(ctx, "gemma-week", "gemma", CUT - dt.timedelta(days=1))  # last week's adaptation
        skipped = plan(ctx, CUT, 7)
        assert skipped["action"] == "skip" and "trained through 2024-03-10" in skipped["reason"]


def test_a_weekly_fine_tune_learns_the_week_and_is_checked_on_it(loaded_settings, new_job):
    """The fine-tune is handed the week as its period (not the month), and the check's questions
    are the week's."""

    class Handed(Exception):
        pass

    handed, checked = [], []

    def capture(ctx, job, **kw):
        handed.append(kw)
        raise Handed

    def questions(ctx, first, before, cfg):
        checked.append((first, before))
        return [("q", first, ("a",))], "gold"

    ctx, job = new_job(loaded_settings, "auto-train")
    cfg = AutoTrainConfig(max_minutes=5, rerank=False, held_back_days=7)
    with (
        patch("workers.auto_train.plan", return_value={"action": "finetune", "parent": "gemma-old"}),
        patch("workers.auto_train.held_back_questions", side_effect=questions),
        patch("workers.train.run_finetune_job", side_effect=capture),
        pytest.raises(Handed),
    ):
        after_ingest(ctx, job, until=CUT, cfg=cfg)
    assert checked == [(dt.date(2024, 3, 4), CUT)]
    assert handed[0]["period"] == (dt.date(2024, 3, 4), CUT) and handed[0]["month"] == "2024-03"


def test_weekly_adaptation_runs_a_cut_once_with_the_adapt_days(loaded_settings):
    calls = []

    def fake(ctx, until, cfg, *, keep_going):
        calls.append((until, cfg.held_back_days, keep_going))
        return {"action": "skip", "reason": "the serving reader is trained through yesterday"}

    with open_context(loaded_settings) as ctx:
        ctx = dataclasses.replace(ctx, auto_train=dataclasses.replace(ctx.auto_train, enabled=True, adapt_days=5))
        with patch("workers.scheduled.run_after_ingest", side_effect=fake):
            first = scheduled.weekly_adaptation(ctx, " 2024-03-11")
            again = scheduled.weekly_adaptation(ctx, "2024-03-11")
        assert calls == [(CUT, 5, True)]
        assert first["state"] == "succeeded" and "nothing to adapt" in first["message"]
        assert again["skipped"] is True
        with ctx.sessions() as session:
            rows = session.query(Job).filter(Job.kind == scheduled.WEEKLY_ADAPTATION).all()
            assert {(r.params or {}).get("period") for r in rows} == {"2024-03-11"}


def test_weekly_adaptation_off_with_auto_train_and_a_failed_training_fails_the_job(loaded_settings):
    with open_context(loaded_settings) as ctx:  # the tests' settings: SQA_AUTO_TRAIN=false
        off = scheduled.weekly_adaptation(ctx, "2024-03-11")
        assert off["state"] == "succeeded" and off["message"] == "SQA_AUTO_TRAIN=false: nothing adapts"
        ctx = dataclasses.replace(ctx, auto_train=dataclasses.replace(ctx.auto_train, enabled=True))
        with patch("workers.scheduled.run_after_ingest", return_value={"job_id": 9, "error": "out of memory"}):
            with pytest.raises(RuntimeError, match="the adaptation's training \\(job 9\\) failed: out of memory"):
                scheduled.weekly_adaptation(ctx, "2024-03-18")


def test_cuts_are_days_and_the_scheduler_lists_the_job_only_when_its_cron_is_set(loaded_settings):
    assert scheduled.normalize_period(scheduled.WEEKLY_ADAPTATION, "2024-03-11") == "2024-03-11"
    with pytest.raises(InvalidInputError, match="cut '2024-03' is not a day"):
        scheduled.normalize_period(scheduled.WEEKLY_ADAPTATION, "2024-03")
    ids = [s.id for s in job_specs(scheduler_config(loaded_settings))]
    assert scheduled.WEEKLY_ADAPTATION not in ids
    weekly = loaded_settings.model_copy(update={"adapt_cron": "0 3 * * 1"})
    (spec,) = [s for s in job_specs(scheduler_config(weekly)) if s.id == scheduled.WEEKLY_ADAPTATION]
    assert spec.cron == "0 3 * * 1" and spec.setting == "SQA_ADAPT_CRON"
