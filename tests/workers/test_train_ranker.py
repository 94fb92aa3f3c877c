"""`sqa train reader --kind ranker` on the shipped sample (hash encoder, the real packaged spaCy):
training and serving see the same features, a registered version serves, reruns reuse the cache."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from app.bootstrap import open_context
from app.bootstrap.builders import build_answer_service, build_encoder, open_database
from evaluation.bakeoff import generation_subset
from evaluation.questions import DatedQuestion
from models.candidates import CandidateRanker
from models.ranker import CandidateReader, RankerConfig, RankerModel
from models.trained import load_trained_reader, read_reader_info
from serving.reader_registry import active_version
from workers.progress import NullProgress as _NoProgress
from workers.ranker_items import prepare_items
from workers.reader_spec import ReaderJobSpec
from workers.train import run_finetune_job, run_train_job

UNTIL = dt.date(2024, 3, 1)
RANKER = dict(kind="ranker", n_passages=10, infer_passages=10, max_self_articles=0)


def _gold(db):
    from sqlalchemy import select

    from store.tables import Question

    with db.sessions() as session:
        rows = session.scalars(select(Question).order_by(Question.asked, Question.qid)).all()
        session.expunge_all()
    return generation_subset([DatedQuestion.of(q) for q in rows])[0]


class _SpyReader(CandidateReader):
    """A CandidateReader that keeps the ranker inputs it built while serving."""

    seen: list

    def items(self, items):
        out = super().items(items)
        self.seen.extend(out)
        return out


@pytest.mark.integration
def test_ranker_training_and_serving_compute_the_same_features(loaded_settings):
    db = open_database(loaded_settings)
    try:
        questions = _gold(db)
        with open_context(loaded_settings) as ctx:
            train_items, _ = prepare_items(ctx, questions, 10, _NoProgress(), embed=False)
        ranker = CandidateRanker(use_score=False).fit(list(train_items.values()))
        reader = _SpyReader(RankerModel(ranker, RankerConfig(n_passages=10)))
        reader.seen = []
        service = build_answer_service(loaded_settings, db, build_encoder(loaded_settings), reader=reader)
        service.index_state.refresh()
        answers = [service.answer(q.text, q.asked).answer for q in questions]
    finally:
        db.close()
    assert len(reader.seen) == len(questions)
    assert any(len(i.passages) == 10 for i in reader.seen)
    assert any(p.score != 0.0 for i in train_items.values() for p in i.passages)  # training saw scores...
    for q, served, answer in zip(questions, reader.seen, answers):
        trained = train_items[q.qid]
        assert len(served.passages) == len(trained.passages) <= 10
        t_cands, t_rows = ranker.rows(trained)
        s_cands, s_rows = ranker.rows(served)
        assert [c.text for c in s_cands] == [c.text for c in t_cands]
        assert s_rows == t_rows, q.qid  # ...and the features ignore them, as serving has none
        assert answer == ranker.predict([trained])[0]


@pytest.mark.integration
def test_train_job_ranker_registers_a_version_that_serves(loaded_settings, new_job):
    spec = ReaderJobSpec(**{**RANKER, "max_self_articles": 12})
    version = run_train_job(*new_job(loaded_settings), until=UNTIL, spec=spec, activate=True)
    assert version.startswith("ranker-2024-03-01-")
    db = open_database(loaded_settings)
    try:
        with db.sessions() as session:
            row = active_version(session)
            assert row.version == version and row.kind == "ranker" and row.trained_until == UNTIL
            assert row.metrics["train"] > 0 and "f1" in row.metrics["validation"]
    finally:
        db.close()
    folder = loaded_settings.models_dir / version
    info = read_reader_info(folder)
    assert info["kind"] == "ranker" and info["data"]["gold"] > 0 and info["data"]["self_labeled"] > 0
    assert info["data"]["val"] > 0 and info["validation"]["n"] == info["data"]["val"]
    assert RankerModel.load(folder).config.c in {h["c"] for h in info["history"]}
    assert sorted(p.name for p in folder.iterdir()) == ["ranker.json", "reader.json"]
    reader = load_trained_reader(folder)
    assert isinstance(reader, CandidateReader) and reader.n_passages == 10
    from models.readers import RetrievedPassage

    day = dt.date(2024, 2, 2)
    p = RetrievedPassage("t", "Ines Okafor coaches the Harriers in Kestrel Bay.", day)
    assert isinstance(reader.generate("Who coaches the Harriers?", day, [p]).text, str)


@pytest.mark.integration
def test_train_job_ranker_rerun_reuses_the_item_cache(loaded_settings, monkeypatch, new_job):
    first = run_train_job(*new_job(loaded_settings), until=UNTIL, spec=ReaderJobSpec(**RANKER))
    import models.selflabel

    def no_spacy():
        raise AssertionError("the rerun must reuse the cached annotations")

    monkeypatch.setattr(models.selflabel, "load_nlp", no_spacy)
    second = run_train_job(*new_job(loaded_settings), until=UNTIL, spec=ReaderJobSpec(**RANKER))
    assert second != first
    a, b = (json.loads((loaded_settings.models_dir / v / "ranker.json").read_text()) for v in (first, second))
    assert a == b  # same data, same fit


@pytest.mark.integration
def test_finetune_refuses_a_ranker(loaded_settings, new_job):
    run_train_job(*new_job(loaded_settings), until=UNTIL, spec=ReaderJobSpec(**RANKER), activate=True)
    with pytest.raises(ValueError, match="refitted rather than fine-tuned"):
        run_finetune_job(*new_job(loaded_settings, "finetune"), month="2024-03")


@pytest.mark.integration
def test_cli_train_reader_ranker_serves_once_activated(sqa, sample_root, monkeypatch):
    from settings import get_settings

    assert sqa("import", "realtimeqa", str(sample_root)).exit_code == 0
    assert sqa("ingest", "--through", "2024-03").exit_code == 0
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "ranker")
    assert r.exit_code == 0, r.output
    version = r.output.split("reader version ", 1)[1].split()[0]
    listed = sqa("models", "list")
    assert version in listed.output and "ranker" in listed.output
    assert sqa("models", "activate", version).exit_code == 0
    monkeypatch.setenv("SQA_READER", "auto")
    get_settings.cache_clear()
    r = sqa("ask", "Who coaches the Harriers?", "--as-of", "2024-03-10", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["versions"]["reader"] == f"ranker:{version}"
    monkeypatch.setenv("SQA_READER", f"version:{version}")
    get_settings.cache_clear()
    assert sqa("ask", "Who coaches the Harriers?", "--as-of", "2024-03-10").exit_code == 0


def test_cli_train_reader_refuses_an_unknown_kind(sqa):
    r = sqa("train", "reader", "--until", "2024-03-01", "--kind", "svm")
    assert r.exit_code == 2 and "--kind 'svm' is unknown (use fid, extractive, gemma or ranker)" in r.output
