"""Reader training and fine-tuning jobs on the invented sample (hash encoder, tiny models): the
extractive reader warm-starts from a tiny random BERT (tests/tiny_models.py) instead of the packaged
MiniLM; what it learns from MiniLM is tests/models/test_trained_readers.py's."""

from __future__ import annotations

import datetime as dt

import pytest
import torch

from app.bootstrap.builders import open_database
from models.trained import load_trained_reader, read_reader_info
from models.training import load_examples
from serving.reader_registry import active_version, list_versions
from workers.reader_data import DataConfig, build_datasets
from workers.reader_spec import ReaderJobSpec
from workers.train import run_finetune_job, run_train_job

# Every test here reads with the packaged spaCy (self-labeled data).
pytestmark = pytest.mark.integration

TINY = dict(
    kind="extractive",
    n_passages=2,
    infer_passages=2,
    max_passage_tokens=64,
    max_epochs=1,
    eval_every=5,
    max_self_articles=12,
    batch_size=2,
)


@pytest.fixture(autouse=True)
def _one_thread_over_a_tiny_bert(tiny_minilm):
    torch.set_num_threads(1)


def _datasets(settings, until: dt.date, val_from: dt.date, *, gold: bool = True, progress=None):
    from app.bootstrap.builders import build_encoder
    from serving.index_state import IndexState
    from serving.retrieval import DenseRetriever

    db = open_database(settings)
    encoder = build_encoder(settings)
    state = IndexState(db.sessions, settings.index_dir, encoder=encoder.name, dim=encoder.dim)
    state.refresh()
    try:
        with db.sessions() as session:
            return build_datasets(
                session,
                DenseRetriever(encoder),
                state.current(),
                train_from=dt.date(2024, 1, 1),
                until=until,
                val_from=val_from,
                cfg=DataConfig(n_passages=2, max_self_articles=12, gold=gold),
                progress=progress,
            )
    finally:
        db.close()


def test_training_data_respect_the_cut_and_hold_the_answer(loaded_settings):
    from evaluation.metrics import answer_in_text

    until, val_from = dt.date(2024, 3, 1), dt.date(2024, 2, 1)
    train, val, counts = _datasets(loaded_settings, until, val_from)
    assert train and val
    assert all(ex.as_of < until for ex in train + val)
    assert all(ex.as_of < val_from for ex in train if ex.source == "gold")
    assert all(ex.as_of >= val_from and ex.source == "gold" for ex in val)
    assert counts.self_labeled > 0 and counts.gold > 0
    for ex in train + val:
        assert all(p.published <= ex.as_of for p in ex.passages), ex.qid
        assert len(ex.passages) <= 2
        assert any(answer_in_text(list(ex.answers), p.text) for p in ex.passages), ex.qid


def test_building_the_data_reports_the_self_labeling_article_by_article_then_the_retrieval(loaded_settings):
    class Recorder:
        def __init__(self) -> None:
            self.stages: list[list] = []  # [name, total, advanced]

        def stage(self, name: str, total: int) -> None:
            self.stages.append([name, total, 0])

        def advance(self, n: int = 1) -> None:
            self.stages[-1][2] += n

    progress = Recorder()
    train, val, counts = _datasets(loaded_settings, dt.date(2024, 3, 1), dt.date(2024, 2, 1), progress=progress)
    (label, articles, labeled), (retrieve, questions, retrieved) = progress.stages
    assert (label, retrieve) == ("self-label", "retrieve")
    assert 0 < articles <= 12 and labeled == articles  # every sampled article counted once, as spaCy reads it
    assert retrieved == questions == len(train) + len(val) + counts.skipped_no_gold_passage


def test_without_gold_the_data_are_self_labeled_only_and_validate_on_the_last_month(loaded_settings):
    until, val_from = dt.date(2024, 3, 1), dt.date(2024, 2, 1)
    train, val, counts = _datasets(loaded_settings, until, val_from, gold=False)
    assert train and val and counts.gold == 0 and counts.self_labeled == len(train)
    assert {ex.source for ex in train + val} == {"self"}  # the imported questions are not used at all
    assert all(ex.as_of >= val_from for ex in val) and all(ex.as_of < until for ex in train + val)


def test_train_job_registers_an_active_version_that_answers(loaded_settings, new_job):
    job = new_job(loaded_settings, "train")
    version = run_train_job(*job, until=dt.date(2024, 3, 1), spec=ReaderJobSpec(**TINY), activate=True)
    db = open_database(loaded_settings)
    try:
        with db.sessions() as session:
            row = active_version(session)
            assert row is not None and row.version == version and row.trained_until == dt.date(2024, 3, 1)
            assert row.metrics["train"] > 0 and "em" in row.metrics["validation"]
    finally:
        db.close()
    folder = loaded_settings.models_dir / version
    info = read_reader_info(folder)
    assert info["kind"] == "extractive" and info["data"]["val"] > 0
    assert not list((loaded_settings.work_dir / "train").glob("*"))  # work folder cleaned after success
    reader = load_trained_reader(folder)
    from models.readers import RetrievedPassage

    assert reader.name == f"extractive:{version}"
    day = dt.date(2024, 2, 2)
    p = RetrievedPassage("Harriers", "Ines Okafor coaches the Harriers.", day)
    answer = reader.generate("Who coaches the Harriers?", day, [p])
    assert answer.text and answer.text in f"{p.title}. {p.dated_text}", answer  # a span of the passage it read
    assert reader.generate("Who coaches the Harriers?", day, []).text == ""  # no passage, no answer


def test_train_job_resumes_from_its_work_folder(loaded_settings, monkeypatch, new_job):
    import models.training as training

    spec = ReaderJobSpec(**{**TINY, "max_epochs": 2})
    calls = {"n": 0}
    real = training.ReaderTrainer.batch_loss

    def crash_after_three(self, batch):
        calls["n"] += 1
        if calls["n"] == 4:
            raise KeyboardInterrupt("killed")
        return real(self, batch)

    monkeypatch.setattr(training.ReaderTrainer, "batch_loss", crash_after_three)
    with pytest.raises(KeyboardInterrupt):
        run_train_job(*new_job(loaded_settings, "train"), until=dt.date(2024, 3, 1), spec=spec)
    work = next((loaded_settings.work_dir / "train").iterdir())
    assert (work / "train.jsonl").exists() and load_examples(work / "train.jsonl")
    monkeypatch.setattr(training.ReaderTrainer, "batch_loss", real)
    version = run_train_job(*new_job(loaded_settings, "train"), until=dt.date(2024, 3, 1), spec=spec)
    info = read_reader_info(loaded_settings.models_dir / version)
    assert info["data"]["data"] == "reused from an interrupted run"


def test_an_interrupted_training_resumes_only_over_the_same_index_and_served_retriever(
    loaded_settings, monkeypatch, new_job
):
    """As `sqa train auto` runs: a re-ranker starts serving in the same process between a killed reader
    training and its rerun, so the passages the reader would learn from are others now."""
    import models.training as training
    import workers.train as train
    from serving.reranking import activate_reranker
    from workers.progress import JobProgress
    from workers.runner import JobHandle
    from workers.train_reranker import RerankerDataConfig, run_train_reranker_job

    until, spec = dt.date(2024, 3, 1), ReaderJobSpec(**{**TINY, "max_epochs": 2})
    built, build, real = [], train.build_datasets, training.ReaderTrainer.batch_loss
    monkeypatch.setattr(train, "build_datasets", lambda *a, **kw: built.append(kw["until"]) or build(*a, **kw))

    def killed(self, batch):
        raise KeyboardInterrupt("killed")

    ctx, job = new_job(loaded_settings, "train")

    def another(kind: str) -> JobHandle:
        job_id = ctx.runner.create(kind, {})
        return JobHandle(ctx.sessions, job_id, JobProgress(ctx.sessions, job_id))

    monkeypatch.setattr(training.ReaderTrainer, "batch_loss", killed)
    with pytest.raises(KeyboardInterrupt):
        run_train_job(ctx, job, until=until, spec=spec)
    [work] = (loaded_settings.work_dir / "train").iterdir()
    stamp = (work / train.RETRIEVAL_STAMP).read_text()
    assert len(built) == 1 and load_examples(work / "train.jsonl")

    before = ctx.served_retriever()
    info = run_train_reranker_job(
        ctx,
        another("train-reranker"),
        until=until,
        kind="features",
        data=RerankerDataConfig(depth=10, max_self_articles=0),
    )
    activate_reranker(loaded_settings.rerankers_dir, info["version"])
    # the context follows the serving re-ranker; its first stage is unchanged
    assert ctx.served_retriever() == f"{before}+{info['version']}" and ctx.retriever == before
    rerun = another("train")
    with pytest.raises(KeyboardInterrupt):
        run_train_job(ctx, rerun, until=until, spec=spec)
    assert len(built) == 2  # the killed run's examples were not reused: gathered again through the re-ranker
    assert (work / train.RETRIEVAL_STAMP).read_text() != stamp
    assert ctx.runner.get(rerun.job_id).counts["previous_run"].startswith("discarded")

    monkeypatch.setattr(training.ReaderTrainer, "batch_loss", real)
    version = run_train_job(ctx, another("train"), until=until, spec=spec)
    assert len(built) == 2  # the same command over the same index and retriever resumes from its examples
    assert read_reader_info(loaded_settings.models_dir / version)["data"]["data"] == "reused from an interrupted run"


def test_finetune_continues_the_active_version(loaded_settings, new_job):
    with pytest.raises(ValueError, match="no trained reader"):
        run_finetune_job(*new_job(loaded_settings, "finetune"), month="2024-03")
    first = run_train_job(
        *new_job(loaded_settings, "train"), until=dt.date(2024, 3, 1), spec=ReaderJobSpec(**TINY), activate=True
    )
    second = run_finetune_job(*new_job(loaded_settings, "finetune"), month="2024-03")
    db = open_database(loaded_settings)
    try:
        with db.sessions() as session:
            rows = {r.version: r for r in list_versions(session)}
            assert rows[second].parent_version == first and rows[second].month == "2024-03"
            assert rows[second].active and not rows[first].active
    finally:
        db.close()
    info = read_reader_info(loaded_settings.models_dir / second)
    assert info["parent_version"] == first and info["data"]["self_labeled"] > 0
