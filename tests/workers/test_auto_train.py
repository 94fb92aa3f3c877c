"""Training after ingestion (workers/auto_train.py): what it decides to do, that it reads nothing
dated on or after the ingested month, and, with a tiny random Gemma as the base (tests/tiny_models.py),
that a version is activated only when it answers the held-back month better than the serving reader."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json

import pytest
import torch

from app.bootstrap import open_context
from models.trained import read_reader_info
from serving.reader_registry import active_version, get_version
from tests.conftest import SAMPLE
from tests.gemma_runs import register_reader
from workers.auto_train import AUTO_TRAIN, after_ingest, describe, held_back_questions, plan
from workers.config import AutoTrainConfig
from workers.train import current_retrieval_key


def test_plan_follows_the_registry(loaded_settings):
    until = dt.date(2024, 3, 1)
    with open_context(loaded_settings) as ctx:
        pinned = plan(ctx, until)
        assert pinned["action"] == "skip" and "SQA_READER=first-entity pins the reader" in pinned["reason"]
        ctx = dataclasses.replace(ctx, reader="auto")
        assert plan(ctx, until) == {"action": "train", "held_back": "2024-02"}  # nothing active: from the base

        register_reader(ctx, "gemma-old", "gemma", dt.date(2024, 1, 15))  # trained before the held-back month
        assert plan(ctx, until) == {"action": "finetune", "parent": "gemma-old", "held_back": "2024-02"}

        register_reader(ctx, "gemma-new", "gemma", dt.date(2024, 2, 29))  # already knows February
        current = plan(ctx, until)
        assert current["action"] == "skip" and "trained through 2024-02-29" in current["reason"]

        register_reader(ctx, "ranker-x", "ranker", dt.date(2024, 2, 29))
        chosen = plan(ctx, until)
        assert chosen["action"] == "skip" and "is a ranker chosen by hand" in chosen["reason"]


def test_held_back_questions_are_the_months_gold_questions(loaded_settings):
    with open_context(loaded_settings) as ctx:
        rows, source = held_back_questions(ctx, dt.date(2024, 2, 1), dt.date(2024, 3, 1), AutoTrainConfig())
    assert source == "gold" and rows
    assert all(dt.date(2024, 2, 1) <= asked < dt.date(2024, 3, 1) for _, asked, _ in rows)


@pytest.mark.integration  # spaCy for the self-labeled questions
def test_held_back_questions_of_a_news_only_store_are_self_labeled(settings):
    from app.bootstrap.builders import build_encoder
    from indexer.importers import read_realtimeqa
    from workers.imports import store_records
    from workers.ingest import ingest
    from workers.ingest_plans import IngestParams

    with open_context(settings) as ctx:
        articles, _, _ = read_realtimeqa(SAMPLE)
        store_records(ctx.sessions, articles, [])  # news only: no question
        ingest(ctx.sessions, build_encoder(settings), ctx.ingest, IngestParams(through=dt.date(2024, 3, 1)))
        rows, source = held_back_questions(
            ctx, dt.date(2024, 2, 1), dt.date(2024, 3, 1), AutoTrainConfig(check_questions=5)
        )
    assert source == "self-labeled" and 0 < len(rows) <= 5
    assert all(dt.date(2024, 2, 1) <= asked < dt.date(2024, 3, 1) and answers for _, asked, answers in rows)


def test_cli_ingest_says_what_it_did_about_training(sqa, monkeypatch):
    from settings import get_settings

    assert sqa("import", "realtimeqa", str(SAMPLE)).exit_code == 0
    r = sqa("ingest", "--through", "2024-02")
    assert r.exit_code == 0, r.output
    assert "training after ingest: off (--no-train or SQA_AUTO_TRAIN=false)" in r.output  # the tests' setting
    monkeypatch.setenv("SQA_AUTO_TRAIN", "true")
    monkeypatch.setenv("SQA_RERANKER", "none")
    get_settings.cache_clear()
    r = sqa("ingest", "--month", "2024-03")
    assert r.exit_code == 0, r.output
    assert "training after ingest: skipped (SQA_READER=first-entity pins the reader" in r.output
    r = sqa("ingest", "--month", "2024-03", "--no-train")
    assert r.exit_code == 0, r.output
    assert "training after ingest: off" in r.output


@pytest.mark.integration  # spaCy for the self-labeled questions
def test_after_ingest_trains_checks_and_activates_only_a_better_reader(loaded_production_settings, tiny_gemma_cache):
    torch.set_num_threads(1)
    settings = loaded_production_settings.model_copy(update={"reader": "auto"})
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    (settings.models_dir / "base").symlink_to(tiny_gemma_cache)  # the serving base and the one trained
    until = dt.date(2024, 3, 1)
    with open_context(settings) as ctx:
        cfg = AutoTrainConfig(max_minutes=0.05, check_questions=4, rerank=False, seeds=1)
        done = ctx.runner.run_new(
            AUTO_TRAIN,
            {"until": str(until)},
            lambda job: after_ingest(ctx, job, until=until, cfg=cfg),
            result_key="auto_train",
            message=describe,
        )
        assert done["action"] == "train" and done["check"]["month"] == "2024-02"
        new, serving = done["check"]["new"], done["check"]["serving"]
        held, _ = held_back_questions(ctx, dt.date(2024, 2, 1), until, cfg)  # the sample's February: fewer than 4
        assert new["n"] == serving["n"] == len(held) > 0 and done["check"]["questions"] == "gold"
        assert done["activated"] == ((new["f1"], new["em"]) > (serving["f1"], serving["em"]))
        with ctx.sessions() as session:
            active = active_version(session)
            assert (active is not None and active.version == done["version"]) == done["activated"]
        # the version learnt nothing dated on or after the ingested month
        info = read_reader_info(ctx.models_dir / done["version"])
        assert info["trained_until"] == str(until) and info["data"]["gold"] > 0
        assert info["data"]["retrieval"] == current_retrieval_key(ctx)  # what a rerun matches a saved run by
        # the untrained base was not scored before the first step: the check above scored the serving reader
        assert info["spec"]["validate_first"] is False and info["history"][0]["step"] > 0


def test_describe_shows_the_mrr_that_breaks_a_recall_tie():
    done = {
        "reranker": {
            "action": "trained",
            "version": "reranker-2023-04-01-abc123",
            "activated": True,
            "validation": {"recall@5": 42.0, "mrr": 0.372},
            "first_stage": {"recall@5": 42.0, "mrr": 0.349},
        },
        "action": "skip",
        "reason": "no questions",
    }
    line = describe(done)
    assert line.startswith(
        "re-ranker reranker-2023-04-01-abc123 activated (held-back recall@5 42.0, MRR 0.372 "
        "vs first stage 42.0, MRR 0.349); "
    )
    assert line.endswith("reader skipped: no questions")


def test_the_re_ranker_is_left_out_while_another_re_ranker_training_holds_its_lock(loaded_settings, new_job):
    from workers.auto_train import _train_reranker
    from workers.train_reranker import RERANKER_TRAINING_LOCK

    ctx, job = new_job(loaded_settings, AUTO_TRAIN)
    with ctx.runner.lock(RERANKER_TRAINING_LOCK).hold():  # `sqa train reranker` running
        what = _train_reranker(ctx, job, dt.date(2024, 3, 1), AutoTrainConfig())
    assert what["action"] == "skip" and "already running" in what["reason"]
    assert not (loaded_settings.work_dir / "train-reranker").exists()  # it gathered nothing


@pytest.mark.parametrize("action", ["train", "finetune"])
def test_a_first_training_is_capped_at_its_first_validation_and_a_fine_tune_is_not(loaded_settings, new_job, action):
    """The spec each path hands to the reader job: a first training stops at GEMMA_MAX_STEPS, a
    fine-tune of the serving version runs on its budget."""
    from unittest.mock import patch

    from workers.reader_spec import GEMMA_MAX_STEPS

    class Handed(Exception):
        pass

    specs = []

    def capture(ctx, job, **kw):
        specs.append(kw["spec"])
        raise Handed

    ctx, job = new_job(loaded_settings, AUTO_TRAIN)
    cfg = AutoTrainConfig(max_minutes=5, rerank=False, context_words=150)
    with (
        patch("workers.auto_train.plan", return_value={"action": action, "parent": "gemma-old"}),
        patch("workers.train.run_train_job", side_effect=capture),
        patch("workers.train.run_finetune_job", side_effect=capture),
        pytest.raises(Handed),
    ):
        after_ingest(ctx, job, until=dt.date(2024, 3, 1), cfg=cfg)
    (spec,) = specs
    assert spec.kind == "gemma" and spec.max_minutes == 5
    assert spec.train_config().max_steps == (GEMMA_MAX_STEPS if action == "train" else 0)
    # SQA_READER_CONTEXT_WORDS reaches a first training (a fine-tune reads as its parent was saved)
    assert spec.gemma_config().context_words == 150


def _fake_runs(clock, specs, key="key-1"):
    """A stand-in for run_train_job: 9 minutes on the fake clock, then a registered LoRA version whose
    reader.json holds the spec and the retrieval key as a real run's does."""
    from tests.gemma_runs import gemma_run

    def fake_run(ctx, job, *, until, spec, activate):
        assert activate is False and until == dt.date(2024, 3, 1)
        specs.append(spec)
        clock[0] += 9 * 60
        return gemma_run(
            ctx.models_dir,
            ctx.sessions,
            f"gemma-2024-03-01-{len(specs):02d}000{spec.seed}",
            seed=spec.seed,
            until="2024-03-01",
            info={"spec": dataclasses.asdict(spec), "data": {"retrieval": key}, "train_seconds": 9 * 60},
        )

    return fake_run


@pytest.mark.parametrize(("seeds", "budget", "runs"), [(2, 30, 2), (2, 10, 1), (1, 30, 1), (3, 30, 3), (3, 25, 2)])
def test_a_first_training_runs_seeds_while_the_budget_has_room_and_serves_their_soup(
    loaded_settings, new_job, seeds, budget, runs
):
    """`train_seeds`: each run (9 minutes on a fake clock) is the same spec with the next seed; another
    starts only if what is left of the budget is at least the runs' mean; two or more are averaged
    into a registered soup (real LoRA tensors: tests/gemma_runs.py), one is returned as it is."""
    from unittest.mock import patch

    from workers.auto_train import train_seeds
    from workers.reader_spec import ReaderJobSpec

    ctx, job = new_job(loaded_settings, AUTO_TRAIN)
    loaded = []
    ctx = dataclasses.replace(ctx, load_reader_folder=loaded.append)  # the soup is loaded before it is stored
    clock, specs = [1000.0], []
    spec = ReaderJobSpec.for_gemma(max_minutes=budget, seed=4, validate_first=False)
    with (
        patch("workers.train.run_train_job", side_effect=_fake_runs(clock, specs)),
        patch("workers.train.current_retrieval_key", return_value="key-1"),
    ):
        version, members = train_seeds(
            ctx, job, until=dt.date(2024, 3, 1), spec=spec, seeds=seeds, clock=lambda: clock[0]
        )
    assert [s.seed for s in specs] == list(range(4, 4 + runs))
    assert all(dataclasses.replace(s, seed=4) == spec for s in specs)  # nothing else differs: each resumes alike
    assert members == [f"gemma-2024-03-01-{k + 1:02d}000{4 + k}" for k in range(runs)]
    with ctx.sessions() as session:
        active = active_version(session)
    assert active is None  # nothing is activated here: after_ingest's check decides
    if runs == 1:
        assert version == members[0] and loaded == []
        return
    info = read_reader_info(ctx.models_dir / version)
    assert version not in members and info["soup_of"] == members
    assert len(loaded) == 1 and loaded[0].name.startswith(".soup-")  # checked before it was moved in
    assert json.loads((ctx.models_dir / version / "gemma_config.json").read_text())["lora_r"] == 2 * runs


def test_a_rerun_takes_the_runs_and_the_soup_a_stopped_job_saved_over_the_same_passages(loaded_settings, new_job):
    """A job stopped after its first run (or after its soup) trains only what is missing when run
    again; runs saved over other passages (a new ingest or re-ranker since) are trained again."""
    from unittest.mock import patch

    from serving.reader_registry import list_versions
    from workers.auto_train import train_seeds
    from workers.reader_spec import ReaderJobSpec

    ctx, job = new_job(loaded_settings, AUTO_TRAIN)
    ctx = dataclasses.replace(ctx, load_reader_folder=lambda folder: None)
    clock, specs = [1000.0], []
    until = dt.date(2024, 3, 1)

    def rerun(key, seeds=2, budget=30):
        spec = ReaderJobSpec.for_gemma(max_minutes=budget, seed=0, validate_first=False)
        with (
            patch("workers.train.run_train_job", side_effect=_fake_runs(clock, specs, key)),
            patch("workers.train.current_retrieval_key", return_value=key),
        ):
            return train_seeds(ctx, job, until=until, spec=spec, seeds=seeds, clock=lambda: clock[0])

    first, (run0,) = rerun("key-1", seeds=1)  # as if the job stopped after its first run
    assert first == run0 and [s.seed for s in specs] == [0]
    soup, members = rerun("key-1")
    assert members[0] == run0 and [s.seed for s in specs] == [0, 1]  # only the second run trained
    assert read_reader_info(ctx.models_dir / soup)["soup_of"] == members
    again, same = rerun("key-1")  # everything saved: nothing trained, the same soup
    assert (again, same) == (soup, members) and len(specs) == 2
    with ctx.sessions() as session:
        assert len(list_versions(session)) == 3  # two runs, one soup: nothing registered twice
    other, fresh = rerun("key-2")  # another index or re-ranker: trained again
    assert [s.seed for s in specs] == [0, 1, 0, 1] and set(fresh).isdisjoint(members) and other != soup
    # a tight budget: the saved run's 9 minutes count, so no second run starts on the rerun either
    one, (tight,) = rerun("key-3", seeds=1, budget=10)
    again_one, same_one = rerun("key-3", budget=10)
    assert (again_one, same_one) == (one, [tight]) and len(specs) == 5


@pytest.mark.parametrize("change", ["active", "fine-tune", "imported", "soup", "until", "budget", "seed", "key"])
def test_a_saved_run_is_only_a_first_training_of_this_very_spec_cut_and_passages(loaded_settings, new_job, change):
    from tests.gemma_runs import gemma_run
    from workers.reader_spec import ReaderJobSpec
    from workers.train import saved_run

    ctx, _ = new_job(loaded_settings, AUTO_TRAIN)
    spec = ReaderJobSpec.for_gemma(max_minutes=30, seed=0, validate_first=False)
    saved = (
        dataclasses.replace(spec, max_minutes=20)
        if change == "budget"
        else dataclasses.replace(spec, seed=1)
        if change == "seed"
        else spec
    )
    info = {
        "spec": dataclasses.asdict(saved),
        "data": {"retrieval": "other" if change == "key" else "key-1"},
        **({"imported_from": "/elsewhere"} if change == "imported" else {}),
        **({"soup_of": ["a", "b"]} if change == "soup" else {}),
    }
    version = gemma_run(
        ctx.models_dir,
        ctx.sessions,
        "gemma-2024-03-01-abcdef",
        seed=0,
        until="2024-02-29" if change == "until" else "2024-03-01",
        info=info,
    )
    with ctx.sessions() as session, session.begin():
        row = get_version(session, version)
        row.active = change == "active"
        row.parent_version = "gemma-parent" if change == "fine-tune" else None
    assert saved_run(ctx, until=dt.date(2024, 3, 1), spec=spec, key="key-1") is None
    with ctx.sessions() as session, session.begin():  # the same version as a plain saved run of this spec: found
        row = get_version(session, version)
        row.active, row.parent_version, row.trained_until = False, None, dt.date(2024, 3, 1)
    path = ctx.models_dir / version / "reader.json"
    plain = {k: v for k, v in json.loads(path.read_text()).items() if k not in ("imported_from", "soup_of")}
    path.write_text(json.dumps({**plain, "spec": dataclasses.asdict(spec), "data": {"retrieval": "key-1"}}))
    found = saved_run(ctx, until=dt.date(2024, 3, 1), spec=spec, key="key-1")
    assert found is not None and found[0] == version


def test_describe_names_the_runs_of_a_soup():
    done = {
        "action": "train",
        "version": "gemma-2023-04-01-cccccc",
        "activated": True,
        "soup_of": ["gemma-2023-04-01-aaaaaa", "gemma-2023-04-01-bbbbbb"],
        "check": {
            "month": "2023-03",
            "questions": "gold",
            "new": {"n": 40, "em": 35.0, "f1": 40.0},
            "serving": {"n": 40, "em": 20.0, "f1": 25.0},
        },
    }
    assert describe(done).startswith(
        "reader gemma-2023-04-01-cccccc (the soup of 2 runs: gemma-2023-04-01-aaaaaa, "
        "gemma-2023-04-01-bbbbbb) activated: on 40 gold questions of 2023-03"
    )
