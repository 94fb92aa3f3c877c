"""The scheduled jobs: the monthly ingest imports and indexes its month once, records an empty
month as done and a failed one as failed (then runs it again); the quarterly evaluation runs once
per quarter. Settings come from SQA_* environment variables, as in the worker."""

from __future__ import annotations

import datetime as dt
import json
import os
import types

import pytest
from sqlalchemy import select

from app.bootstrap import scheduled_monthly_ingest as monthly_ingest
from app.bootstrap import scheduled_quarterly_evaluation as quarterly_evaluation
from app.bootstrap.builders import open_database
from serving.errors import InvalidInputError
from settings import get_settings
from store.tables import Article, EvalRun, IndexSnapshot, Job
from workers.after_ingest import NO_ACTIVE_READER, RANKER_REFIT
from workers.scheduled import previous_month, previous_quarter, today_utc


@pytest.fixture
def use_env(monkeypatch, tmp_path):
    """Set SQA_* variables (a fresh SQA_HOME, the fast fakes) and reload get_settings()."""
    for key in list(os.environ):
        if key.startswith("SQA_") and key != "SQA_TEST_POSTGRES_URL":
            monkeypatch.delenv(key)

    def use(**values):
        base = {"home": tmp_path / "home", "encoder": "hash", "reader": "first-entity", "env": "test"}
        for key, value in {**base, **values}.items():
            monkeypatch.setenv(f"SQA_{key.upper()}", str(value))
        get_settings.cache_clear()
        return get_settings()

    yield use
    get_settings.cache_clear()


def rows(settings, model, *where):
    db = open_database(settings, migrate=False)
    try:
        with db.sessions() as session:
            return list(session.scalars(select(model).where(*where).order_by(model.id)))
    finally:
        db.close()


def write_inbox(folder, articles) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "news.jsonl", "w") as fh:
        for a in articles:
            fh.write(json.dumps(a) + "\n")


def article(n: int, day: str) -> dict:
    text = " ".join(f"Councillor Mara Quill of Greyfen opened bridge number {n} on its {i}th day." for i in range(8))
    return {"id": f"inbox-{n}", "title": f"Bridge {n}", "text": text, "published": day}


def test_previous_month_and_quarter_are_the_ones_just_ended():
    assert previous_month(dt.date(2024, 3, 1)) == "2024-02"
    assert previous_month(dt.date(2024, 1, 31)) == "2023-12"
    assert previous_quarter(dt.date(2024, 1, 2)) == "2023Q4"
    assert previous_quarter(dt.date(2024, 4, 2)) == "2024Q1"
    assert previous_quarter(dt.date(2024, 12, 31)) == "2024Q3"


def test_monthly_ingest_indexes_the_month_then_skips_it(use_env, sample_root):
    settings = use_env(news_source=f"realtimeqa:{sample_root}")
    first = monthly_ingest("2024-02")
    assert first["state"] == "succeeded" and not first["skipped"] and first["period"] == "2024-02"
    assert first["counts"]["import"]["articles"]["inserted"] == 12  # the sample has 12 articles a month
    assert first["counts"]["import"]["questions"]["inserted"] > 0
    assert first["counts"]["ingest"]["passages"] > 0
    assert first["counts"]["finetune"] == {"policy": "never", "ran": False}
    auto = first["counts"]["auto_train"]  # the tests' settings pin the reader: nothing to train
    assert auto["action"] == "skip" and "SQA_READER=first-entity pins the reader" in auto["reason"]
    published = {a.published for a in rows(settings, Article)}
    assert min(published) >= dt.date(2024, 2, 1) and max(published) <= dt.date(2024, 2, 29)
    [snapshot] = rows(settings, IndexSnapshot)
    assert snapshot.shard_keys == ["2024-02"]

    again = monthly_ingest("2024-02")
    assert again["skipped"] and again["state"] == "skipped"
    assert again["counts"] == {"done_by_job": first["job_id"]}
    assert len(rows(settings, IndexSnapshot)) == 1  # nothing re-ingested
    assert [j.state for j in rows(settings, Job, Job.kind == "monthly-ingest")] == ["succeeded", "skipped"]


def test_monthly_ingest_month_without_articles_succeeds_with_a_note(use_env, sample_root):
    settings = use_env(news_source=f"realtimeqa:{sample_root}")
    result = monthly_ingest("2023-06")
    assert result["state"] == "succeeded"
    assert result["counts"]["note"] == "no articles" and result["message"].startswith("no articles")
    assert result["counts"]["ingest"] is None
    assert rows(settings, IndexSnapshot) == []


def test_monthly_ingest_defaults_to_the_month_just_ended(use_env):
    use_env()  # no news source: indexes what is imported (nothing here)
    result = monthly_ingest()
    assert result["period"] == previous_month(today_utc()) and result["state"] == "succeeded"


def test_monthly_ingest_reads_an_inbox_folder(use_env, tmp_path):
    inbox = tmp_path / "inbox"
    write_inbox(inbox, [article(1, "2024-05-03"), article(2, "2024-05-20"), article(3, "2024-06-01")])
    settings = use_env(news_source=f"inbox:{inbox}", finetune_policy="always")
    result = monthly_ingest("2024-05")
    assert result["state"] == "succeeded"
    assert result["counts"]["import"]["articles"]["inserted"] == 2
    assert result["counts"]["import"]["out_of_range"] == 1  # the June article waits for June
    assert result["counts"]["ingest"]["articles"] == 2 and result["counts"]["ingest"]["passages"] > 0
    assert result["counts"]["finetune"] == {"policy": "always", "ran": False, "reason": NO_ACTIVE_READER}
    assert {a.url for a in rows(settings, Article)} == {"id:inbox-1", "id:inbox-2"}


@pytest.mark.parametrize("policy", ["always", "on-drift"])
def test_monthly_ingest_never_fine_tunes_an_active_ranker(use_env, tmp_path, policy):
    from store.tables import ReaderModel

    inbox = tmp_path / "inbox"
    write_inbox(inbox, [article(1, "2024-05-03"), article(2, "2024-05-20")])
    settings = use_env(news_source=f"inbox:{inbox}", finetune_policy=policy)
    db = open_database(settings)
    with db.sessions() as session, session.begin():
        session.add(ReaderModel(version="r1", kind="ranker", path="r1", state="ready", active=True, metrics={}))
    db.close()
    result = monthly_ingest("2024-05")
    assert result["state"] == "succeeded"
    assert result["counts"]["finetune"] == {"policy": policy, "ran": False, "reason": RANKER_REFIT}
    assert rows(settings, Job, Job.kind == "finetune") == []


def test_monthly_ingest_runs_a_failed_month_again(use_env, tmp_path):
    inbox = tmp_path / "inbox"
    settings = use_env(news_source=f"inbox:{inbox}")
    with pytest.raises(FileNotFoundError, match="inbox"):
        monthly_ingest("2024-05")
    [failed] = rows(settings, Job, Job.kind == "monthly-ingest")
    assert failed.state == "failed" and "not a directory" in failed.error and failed.finished_at is not None

    write_inbox(inbox, [article(1, "2024-05-03")])
    result = monthly_ingest("2024-05")
    assert result["state"] == "succeeded" and not result["skipped"]
    assert [j.state for j in rows(settings, Job, Job.kind == "monthly-ingest")] == ["failed", "succeeded"]


@pytest.mark.parametrize("month, indexed", [("2024-05", True), ("2024-04", False)])
def test_monthly_ingest_trains_through_train_after_ingest(use_env, tmp_path, monkeypatch, month, indexed):
    """The month's job hands its month (and whether it had articles) to the one post-ingest function
    and keeps what that returned in its counts."""
    import workers.scheduled

    inbox = tmp_path / "inbox"
    write_inbox(inbox, [article(1, "2024-05-03")])
    use_env(news_source=f"inbox:{inbox}")
    calls = []

    def train_after_ingest(ctx, first, *, indexed):
        calls.append((first, indexed))
        return {"auto_train": {"action": "skip", "reason": "faked"}, "finetune": {"policy": "never", "ran": False}}

    monkeypatch.setattr(workers.scheduled, "train_after_ingest", train_after_ingest)
    result = monthly_ingest(month)
    assert result["state"] == "succeeded"
    assert calls == [(dt.date.fromisoformat(f"{month}-01"), indexed)]
    assert result["counts"]["auto_train"] == {"action": "skip", "reason": "faked"}
    assert result["counts"]["finetune"] == {"policy": "never", "ran": False}


def test_monthly_ingest_rejects_an_unknown_news_source(use_env):
    use_env(news_source="ftp://news")
    with pytest.raises(InvalidInputError, match="SQA_NEWS_SOURCE"):
        monthly_ingest("2024-05")


# ---- the quarterly evaluation ----------------------------------------------------------------------


@pytest.fixture
def fake_evaluation(monkeypatch):
    """Replace workers.evaluate.run_quarterly_evaluation by a fake that records a succeeded EvalRun;
    `fail` holds quarters whose next evaluation raises. The real module is imported (a broken import
    fails the test) and must still define the function the job calls (raising=True)."""
    import workers.evaluate

    calls: list[tuple[str, int | None]] = []
    fail: set[str] = set()

    def run_quarterly_evaluation(ctx, quarter, *, job_id=None):
        calls.append((quarter, job_id))
        if quarter in fail:
            fail.discard(quarter)
            raise RuntimeError("the reader ran out of memory")
        with ctx.sessions() as session, session.begin():
            run = EvalRun(kind="quarterly", params={"quarter": quarter}, state="succeeded", job_id=job_id)
            session.add(run)
            session.flush()
            return run.id

    monkeypatch.setattr(workers.evaluate, "run_quarterly_evaluation", run_quarterly_evaluation)
    return types.SimpleNamespace(calls=calls, fail=fail)


def test_quarterly_evaluation_is_idempotent_per_quarter(use_env, fake_evaluation):
    settings = use_env()
    first = quarterly_evaluation("2023Q2")
    assert first["state"] == "succeeded" and first["period"] == "2023Q2"
    assert fake_evaluation.calls == [("2023Q2", first["job_id"])]
    assert rows(settings, EvalRun)[0].id == first["counts"]["eval_run_id"]

    again = quarterly_evaluation("2023q2")
    assert again["skipped"] and fake_evaluation.calls == [("2023Q2", first["job_id"])]
    other = quarterly_evaluation("2023Q3")
    assert other["state"] == "succeeded" and len(fake_evaluation.calls) == 2


def test_quarterly_evaluation_skips_a_quarter_evaluated_outside_the_job(use_env, fake_evaluation):
    settings = use_env()
    db = open_database(settings)
    with db.sessions() as session, session.begin():  # e.g. by the CLI
        session.add(EvalRun(kind="quarterly", params={"quarter": "2023Q4"}, state="succeeded"))
    db.close()
    result = quarterly_evaluation("2023Q4")
    assert result["skipped"] and "eval_run_id" in result["counts"]
    assert fake_evaluation.calls == []


def test_quarterly_evaluation_runs_a_failed_quarter_again(use_env, fake_evaluation):
    settings = use_env()
    fake_evaluation.fail.add("2023Q1")
    with pytest.raises(RuntimeError, match="out of memory"):
        quarterly_evaluation("2023Q1")
    assert quarterly_evaluation("2023Q1")["state"] == "succeeded"
    states = [j.state for j in rows(settings, Job, Job.kind == "quarterly-evaluation")]
    assert states == ["failed", "succeeded"]


def test_quarterly_evaluation_rejects_a_bad_quarter(use_env, fake_evaluation):
    settings = use_env()
    with pytest.raises(InvalidInputError, match="YYYYQN"):
        quarterly_evaluation("2023Q5")
    assert fake_evaluation.calls == []
    assert not (settings.home / "sqa.db").exists() or rows(settings, Job) == []
