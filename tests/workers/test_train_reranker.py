"""`sqa train reranker` on the invented sample (hash encoder): candidates from the first stage, the
real MiniLM cross-encoder for one short epoch, the recency fit, the version folder and activation."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pytest
import torch

from models.gemma_weights import native_bfloat16
from models.reranker import CrossEncoderReranker, Group, RerankerConfig
from serving.reranking import active_reranker, list_reranker_versions
from workers.train_reranker import RECENCY_GRID, RerankerDataConfig, ranking_figures, run_train_reranker_job


@pytest.mark.integration  # the real MiniLM weights
def test_bfloat16_training_on_a_cpu_moves_the_float32_weights_and_scores_in_float32():
    torch.manual_seed(0)
    model = CrossEncoderReranker.from_packaged(RerankerConfig(precision="bfloat16", groups_per_step=1, negatives=1))
    before = {k: v.clone() for k, v in model.model.state_dict().items()}
    groups = [Group("Who coaches the Harriers?", "Ines Okafor coaches the Harriers.", ("Rain fell.",))] * 2
    result = model.train_groups(groups)
    after = model.model.state_dict()
    assert result["steps"] == 2 and all(v.dtype == torch.float32 for v in after.values())
    assert any(not torch.equal(before[k], after[k]) for k in before)
    scores = model.scores("Who coaches the Harriers?", ["Ines Okafor coaches the Harriers.", "Rain fell."])
    assert scores.dtype.name == "float32" and bool(np.isfinite(scores).all())


@pytest.mark.integration  # the real MiniLM weights
def test_a_killed_training_resumes_from_its_checkpoint_to_the_weights_of_an_unbroken_run(tmp_path):
    cfg = RerankerConfig(groups_per_step=1, negatives=1)
    groups = [
        Group(f"Who coaches team {i}?", f"Coach {i} leads team {i}.", (f"Rain fell on day {i}.",)) for i in range(6)
    ]
    torch.manual_seed(0)
    unbroken = CrossEncoderReranker.from_packaged(cfg)
    result = unbroken.train_groups(groups, checkpoint=tmp_path / "a.pt", checkpoint_every=2)
    assert result["steps"] == 6 and result["resumed_at"] == 0

    torch.manual_seed(0)
    killed = CrossEncoderReranker.from_packaged(cfg)
    forward, calls = killed._forward, []

    def dies_at_the_fourth_step(*args):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt("killed")
        return forward(*args)

    killed._forward = dies_at_the_fourth_step
    with pytest.raises(KeyboardInterrupt):
        killed.train_groups(groups, checkpoint=tmp_path / "b.pt", checkpoint_every=2)

    torch.manual_seed(123)  # another process: another head until the checkpoint is read
    again = CrossEncoderReranker.from_packaged(cfg)
    result = again.train_groups(groups, checkpoint=tmp_path / "b.pt", checkpoint_every=2)
    assert result["steps"] == 6 and result["resumed_at"] == 2
    want, got = unbroken.model.state_dict(), again.model.state_dict()
    assert all(torch.allclose(want[k], got[k], atol=1e-6) for k in want)
    with pytest.raises(ValueError, match="delete it to start again"):
        again.train_groups(groups[:4], checkpoint=tmp_path / "b.pt")


def test_ranking_figures_count_a_question_without_a_positive_as_a_miss():
    items = [{"cands": [{"hit": False, "age": 0}, {"hit": True, "age": 30}]}, {"cands": [{"hit": False, "age": 0}]}]
    assert ranking_figures(items, None) == {"recall@1": 0.0, "recall@5": 50.0, "recall@10": 50.0, "mrr": 0.25}
    # scores that put the hit first; a recency weight large enough brings the fresh miss back on top
    assert ranking_figures(items, [[0.0, 1.0], [0.0]])["recall@1"] == 50.0
    assert ranking_figures(items, [[0.0, 1.0], [0.0]], recency=1.0)["recall@1"] == 0.0


@pytest.mark.integration  # the real MiniLM weights as a cross-encoder
def test_train_a_reranker_version_and_activate_it_only_if_it_beats_the_first_stage(loaded_settings, new_job):
    torch.set_num_threads(1)
    data = RerankerDataConfig(depth=10, negatives=3, max_self_articles=0)
    info = run_train_reranker_job(
        *new_job(loaded_settings, "train-reranker"), until=dt.date(2024, 3, 1), data=data, activate=True
    )
    assert info["held_back"] == "2024-02" and info["data"]["gold"] > 0 and info["data"]["groups"] > 0
    assert info["recency_weight"] in RECENCY_GRID
    assert set(info["validation"]) == {"recall@1", "recall@5", "recall@10", "mrr"}
    key = {name: (info[name]["recall@5"], info[name]["mrr"]) for name in ("validation", "first_stage", "prior_alone")}
    better = key["validation"] > key["first_stage"] and key["validation"][0] > key["prior_alone"][0]
    assert info["activated"] == better
    assert (active_reranker(loaded_settings.rerankers_dir) == info["version"]) == better
    [listed] = list_reranker_versions(loaded_settings.rerankers_dir)
    assert listed["version"] == info["version"] and listed["active"] == better

    model = CrossEncoderReranker.load(loaded_settings.rerankers_dir / info["version"])
    assert model.info["recency_weight"] == info["recency_weight"]
    # the version's own file says what the rule decided, whether it was asked to activate or not
    assert model.info["worth_serving"] == better and model.info["prior_alone"] == info["prior_alone"]
    # trained in bfloat16 where the CPU computes it natively (AVX512-BF16, AMX), the weights kept in float32
    assert model.cfg.precision == ("bfloat16" if native_bfloat16("cpu") else "float32")
    assert {p.dtype for p in model.model.parameters()} == {torch.float32}
    scores = model.scores(
        "Who coaches the Harriers?", ["Harriers. Ines Okafor coaches the Harriers.", "Weather. Rain."]
    )
    assert scores.shape == (2,) and scores.dtype.name == "float32"


def test_train_a_feature_reranker_version_that_serves_through_the_first_stage(loaded_settings, new_job):
    from app.bootstrap.builders import build_answer_service, build_encoder, open_database
    from models.ltr import FeatureReranker
    from models.reranker import load_reranker
    from serving.reranking import activate_reranker

    data = RerankerDataConfig(depth=10, max_self_articles=0)
    info = run_train_reranker_job(
        *new_job(loaded_settings, "train-reranker"),
        until=dt.date(2024, 3, 1),
        data=data,
        activate=True,
        kind="features",
    )
    assert info["kind"] == "features" and info["held_back"] == "2024-02" and info["data"]["questions_used"] > 0
    # its features hold the first stage's score and the age: no weights are fitted on top of it
    assert info["recency_weight"] == info["first_stage_weight"] == 0.0 and info["validation"] == info["model_alone"]
    assert set(info["validation"]) == {"recall@1", "recall@5", "recall@10", "mrr"}
    better = (info["validation"]["recall@5"], info["validation"]["mrr"]) > (
        info["first_stage"]["recall@5"],
        info["first_stage"]["mrr"],
    )
    assert info["activated"] == better
    folder = loaded_settings.rerankers_dir / info["version"]
    assert [p.name for p in folder.iterdir()] == ["reranker.json"]  # no weights beside it: plain JSON
    model = load_reranker(folder)
    assert isinstance(model, FeatureReranker) and model.info["first_stage_weight"] == info["first_stage_weight"]

    # served: the active version re-orders the first stage's top candidates, none after the date
    activate_reranker(loaded_settings.rerankers_dir, info["version"])
    settings = loaded_settings.model_copy(update={"reranker": "auto", "rerank_depth": 10})
    db = open_database(settings)
    try:
        service = build_answer_service(settings, db, build_encoder(settings))
        service.index_state.refresh()
        snap = service.index_state.current()
        as_of = dt.date(2024, 2, 20)
        with db.sessions() as session:
            timings = {}
            got = service.retriever.retrieve(session, snap, "Who coaches the Harriers?", as_of, 5, timings)
            base = service.retriever.base.retrieve(session, snap, "Who coaches the Harriers?", as_of, 10)
        assert service.retriever.name.endswith(info["version"]) and set(timings) == {"first_stage", "rerank"}
        assert {p.passage_id for p in got} <= {p.passage_id for p in base} and len(got) == min(5, len(base))
        assert all(p.published <= as_of for p in got)
    finally:
        db.close()


def test_an_unknown_reranker_kind_is_refused_before_any_work(loaded_settings, new_job):
    with pytest.raises(ValueError, match="kind 'bert' is unknown"):
        run_train_reranker_job(*new_job(loaded_settings, "train-reranker"), until=dt.date(2024, 3, 1), kind="bert")


def test_an_interrupted_run_resumes_from_its_candidates_only_over_the_same_index_and_first_stage(
    loaded_settings, new_job, monkeypatch
):
    import workers.train_reranker as train_reranker

    built, build, fit = [], train_reranker.build_items, train_reranker._train_features
    monkeypatch.setattr(train_reranker, "build_items", lambda *a, **kw: built.append(kw["cfg"]) or build(*a, **kw))

    def killed(*args, **kwargs):
        raise RuntimeError("killed after gathering the candidates")

    monkeypatch.setattr(train_reranker, "_train_features", killed)
    data = RerankerDataConfig(depth=10, max_self_articles=0)
    with pytest.raises(RuntimeError, match="killed"):
        run_train_reranker_job(
            *new_job(loaded_settings, "train-reranker"), until=dt.date(2024, 3, 1), data=data, kind="features"
        )
    assert len(built) == 1
    monkeypatch.setattr(train_reranker, "_train_features", fit)
    # another first stage finds other candidates: they are gathered again, not taken from the cache
    bm25 = loaded_settings.model_copy(update={"retriever": "bm25"})
    run_train_reranker_job(*new_job(bm25, "train-reranker"), until=dt.date(2024, 3, 1), data=data, kind="features")
    assert len(built) == 2
    # the same command as the killed run resumes from its candidates
    info = run_train_reranker_job(
        *new_job(loaded_settings, "train-reranker"), until=dt.date(2024, 3, 1), data=data, kind="features"
    )
    assert len(built) == 2 and info["data"]["questions_used"] > 0
    assert not any((loaded_settings.work_dir / "train-reranker").iterdir())  # a finished run leaves no cache


def test_a_run_deletes_the_candidates_a_killed_run_gathered_over_an_older_snapshot(
    loaded_settings, new_job, monkeypatch
):
    import workers.train_reranker as train_reranker

    def killed(*args, **kwargs):
        raise RuntimeError("killed after gathering the candidates")

    fit = train_reranker._train_features
    monkeypatch.setattr(train_reranker, "_train_features", killed)
    data = RerankerDataConfig(depth=10, max_self_articles=0)
    with pytest.raises(RuntimeError, match="killed"):
        run_train_reranker_job(
            *new_job(loaded_settings, "train-reranker"), until=dt.date(2024, 3, 1), data=data, kind="features"
        )
    folder = loaded_settings.work_dir / "train-reranker"
    (kept,) = folder.iterdir()
    serving = (kept / train_reranker.SNAPSHOT_STAMP).read_text()
    # what a run killed before a later ingest left: its stamp names the snapshot it was gathered over
    stale = folder / "data-2024-03-01-0123456789-9876543210"
    stale.mkdir()
    (stale / train_reranker.SNAPSHOT_STAMP).write_text("20240101T000000000000Z-000000")
    (stale / "items.json").write_text("{}")
    unstamped = folder / "data-2024-03-01-aaaaaaaaaa-bbbbbbbbbb"  # from before stamps: left alone
    unstamped.mkdir()
    monkeypatch.setattr(train_reranker, "_train_features", fit)
    # another first stage over the same snapshot: the killed run's candidates stay for its rerun
    bm25 = loaded_settings.model_copy(update={"retriever": "bm25"})
    run_train_reranker_job(*new_job(bm25, "train-reranker"), until=dt.date(2024, 3, 1), data=data, kind="features")
    assert sorted(p.name for p in folder.iterdir()) == sorted([kept.name, unstamped.name])
    assert (kept / train_reranker.SNAPSHOT_STAMP).read_text() == serving and (kept / "items.json").exists()


@pytest.mark.integration  # the real MiniLM weights as a cross-encoder
def test_export_train_elsewhere_and_import_a_cross_encoder_version(loaded_settings, new_job, tmp_path):
    import json

    from models.train_exported_reranker import read_export, train_exported
    from serving.reranking import import_reranker
    from workers.train_reranker import run_export_reranker_job

    torch.set_num_threads(1)
    data = RerankerDataConfig(depth=10, max_self_articles=0)
    export = tmp_path / "export"
    job = run_export_reranker_job(
        *new_job(loaded_settings, "export-reranker-data"),
        until=dt.date(2024, 3, 1),
        dest=export,
        data=data,
        negatives=3,
    )
    assert job["held_back"] == "2024-02" and job["data"]["gold"] > 0 and job["train_questions"] > 0
    _, train, val = read_export(export)
    assert len(val) == job["val_questions"] > 0 and all(
        len(i["cands"]) <= 5 for i in train
    )  # 1..2 positives, <= 3 negatives
    assert all(i["asked"] < "2024-02-01" for i in train) and all(i["asked"] >= "2024-02-01" for i in val)

    out = tmp_path / "version"
    info = train_exported(export, out, epochs=2, groups_per_step=4, negatives=3, half=True)
    assert info["held_back"] == "2024-02" and [h["epoch"] for h in info["train"]["history"]] == [1, 2]
    assert info["train"]["best_epoch"] in (1, 2) and info["trained_elsewhere"] == {
        "device": "cpu",
        "precision": "float32",
    }
    key = {name: (info[name]["recall@5"], info[name]["mrr"]) for name in ("validation", "first_stage", "prior_alone")}
    assert info["worth_serving"] == (
        key["validation"] > key["first_stage"] and key["validation"][0] > key["prior_alone"][0]
    )

    imported = import_reranker(loaded_settings.rerankers_dir, out)
    assert imported["version"] == info["version"]
    [listed] = list_reranker_versions(loaded_settings.rerankers_dir)
    assert listed["version"] == info["version"] and not listed["active"]  # importing does not activate
    model = CrossEncoderReranker.load(loaded_settings.rerankers_dir / info["version"])
    assert next(model.model.parameters()).dtype == torch.float32  # saved as float16, served as float32
    assert model.info["recency_weight"] == info["recency_weight"]
    with pytest.raises(ValueError, match="already in"):
        import_reranker(loaded_settings.rerankers_dir, out)

    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "reranker.json").write_text(json.dumps({**info, "version": "reranker-broken"}))
    with pytest.raises(ValueError, match="does not load as a re-ranker version"):
        import_reranker(loaded_settings.rerankers_dir, broken)
    assert sorted(p.name for p in loaded_settings.rerankers_dir.iterdir()) == [info["version"]]


def test_cli_rerankers_import_refuses_a_folder_that_is_not_a_version(sqa, tmp_path):
    r = sqa("rerankers", "import", str(tmp_path / "nowhere"))
    assert r.exit_code != 0 and "is not a re-ranker version" in r.output, r.output
    r = sqa("train", "reranker", "--until", "2024-03-01", "--kind", "features", "--export", str(tmp_path / "x"))
    assert r.exit_code != 0 and "--export is for --kind cross-encoder" in r.output, r.output
