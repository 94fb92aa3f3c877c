"""FiD and the extractive span reader: shapes, training on a toy set, exact reload, time checks.

Most use the packaged MiniLM weights (small configs keep each test to a few seconds); FiD learns the
toy set from a tiny random BERT (tests/tiny_models.py: a few hundred steps in seconds, where MiniLM's
forty took minutes), and a step of the packaged one shows it trains, saves and reloads exactly."""

from __future__ import annotations

import datetime as dt

import pytest
import torch

from models.extractive import ExtractiveReader, SpanConfig, SpanModel
from models.fid import FiDConfig, FiDModel, FiDReader, fid_input, recase
from models.readers import RetrievedPassage
from models.trained import load_trained_reader, read_reader_info, write_reader_info
from models.training import ReaderTrainer, TrainConfig, TrainExample

DAY = dt.date(2024, 2, 7)
P1 = RetrievedPassage(
    "Harriers appoint coach",
    "The Kestrel Bay Harriers named Ines Okafor as head coach on Tuesday.",
    DAY,
)
P2 = RetrievedPassage(
    "Rail contract",
    "Vandermere awarded the light-rail contract to Hallam & Pryce Engineering.",
    DAY,
)
Q1, A1 = "Who is the head coach of the Kestrel Bay Harriers?", "Ines Okafor"
Q2, A2 = "Which company won the Vandermere light-rail contract?", "Hallam & Pryce Engineering"


@pytest.fixture(autouse=True)
def _one_thread():
    torch.manual_seed(0)
    torch.set_num_threads(1)


def examples() -> list[TrainExample]:
    return [TrainExample("q1", Q1, DAY, (A1,), (P2, P1)), TrainExample("q2", Q2, DAY, (A2,), (P1, P2))]


def test_fid_input_carries_date_question_title_and_passage():
    text = fid_input(Q1, DAY, P1)
    assert text.startswith("question: Today is Wednesday, February 7, 2024. Who is the head coach")
    assert " title: Harriers appoint coach context: Wednesday, February 7, 2024. The Kestrel" in text


@pytest.mark.integration
def test_fid_encode_inputs_shapes_and_missing_passages_masked():
    model = FiDModel.warm_start(FiDConfig(n_passages=3, max_passage_tokens=48))
    ids, mask = model.encode_inputs([(Q1, DAY, [P1, P2]), (Q2, DAY, [P2])])
    assert ids.shape[:2] == (2, 3) and ids.shape == mask.shape
    assert ids.shape[2] <= 48
    assert mask[0, 2].sum() == 1 and mask[1, 1].sum() == 1  # padded passages: only their first token
    assert mask[0, 0].sum() > 10
    labels = model.encode_answers([A1])
    assert labels[0, 0].item() != model.tokenizer.cls_token_id  # [CLS] is the decoder's start, not a label
    assert model.tokenizer.sep_token_id in labels[0].tolist()


def test_recase_returns_the_passage_spelling():
    assert recase("ines okafor", [P2, P1]) == "Ines Okafor"
    assert recase("hallam & pryce engineering", [P2]) == "Hallam & Pryce Engineering"
    assert recase("nobody", [P1]) == "nobody"


def test_fid_learns_toy_set_and_reloads_exactly(tmp_path, tiny_bert):
    model = FiDModel.warm_start(
        FiDConfig(base=str(tiny_bert), n_passages=2, max_passage_tokens=48, max_answer_tokens=8)
    )
    untrained = FiDReader(model)
    assert [untrained.generate(Q1, DAY, [P2, P1]).text, untrained.generate(Q2, DAY, [P1, P2]).text] != [A1, A2]
    trainer = ReaderTrainer(
        model,
        "fid",
        TrainConfig(lr=1e-2, batch_size=2, max_epochs=100, warmup_steps=1, eval_every=50, patience=5),
        tmp_path / "run",
    )
    result = trainer.train(examples(), examples())
    assert result.best["em"] == 100.0, result.history
    reader = FiDReader(FiDModel.load(trainer.best_dir))
    assert reader.generate(Q1, DAY, [P2, P1]).text == A1
    again = FiDModel.load(trainer.best_dir)
    assert again.config == reader.model.config
    assert again.generate([(Q2, DAY, [P1, P2])]) == reader.model.generate([(Q2, DAY, [P1, P2])])


@pytest.mark.integration
def test_fid_from_the_packaged_minilm_trains_saves_and_reloads_exactly(tmp_path):
    model = FiDModel.warm_start(FiDConfig(n_passages=2, max_passage_tokens=48, max_answer_tokens=8))
    trainer = ReaderTrainer(
        model,
        "fid",
        TrainConfig(lr=5e-4, batch_size=2, max_epochs=1, warmup_steps=1, eval_every=1, patience=5),
        tmp_path / "run",
    )
    result = trainer.train(examples(), examples())
    assert result.steps == 1 and result.best["step"] == 1 and result.best["loss"] > 0
    again = FiDModel.load(trainer.best_dir)
    assert again.config == model.config
    saved, trained = again.state_dict(), model.state_dict()
    assert saved.keys() == trained.keys() and all(torch.equal(saved[k], trained[k]) for k in saved)
    model.eval()
    items = [(Q1, DAY, [P2, P1]), (Q2, DAY, [P1, P2])]
    assert again.generate(items) == model.generate(items)
    assert FiDReader(again).generate(Q1, DAY, [P2, P1]).text == FiDReader(model).generate(Q1, DAY, [P2, P1]).text


@pytest.mark.integration
def test_fid_reader_refuses_passages_after_as_of():
    reader = FiDReader(FiDModel.warm_start(FiDConfig(n_passages=1, max_passage_tokens=32)))
    with pytest.raises(AssertionError, match="published after"):
        reader.generate(Q1, DAY - dt.timedelta(days=1), [P1])
    assert reader.generate(Q1, DAY, []).text == ""


@pytest.mark.integration
def test_span_answer_positions_find_every_occurrence():
    model = SpanModel.warm_start(SpanConfig(n_passages=2, max_passage_tokens=64))
    batch = model.encode_inputs([(Q1, DAY, [P1, P2])])
    starts, ends = model.answer_positions(batch, [[A1]])[0]
    assert len(starts) == 1 and ends[0] >= starts[0]
    length = batch.ids.shape[2]
    j, s = divmod(starts[0], length)
    cs = batch.offsets[0][j][s][0]
    assert batch.texts[0][j][cs:].startswith("Ines Okafor")
    assert model.answer_positions(batch, [["Zanzibar"]])[0] == ([], [])


@pytest.mark.integration
def test_extractive_learns_toy_set_and_reloads(tmp_path):
    model = SpanModel.warm_start(SpanConfig(n_passages=2, max_passage_tokens=64))
    trainer = ReaderTrainer(
        model,
        "extractive",
        TrainConfig(lr=3e-4, batch_size=2, max_epochs=8, warmup_steps=1, eval_every=8, patience=5),
        tmp_path / "run",
    )
    result = trainer.train(examples(), examples())
    assert result.best["em"] == 100.0, result.history
    reader = ExtractiveReader(SpanModel.load(trainer.best_dir))
    assert reader.generate(Q2, DAY, [P1, P2]).text == A2


@pytest.mark.integration
def test_trainer_resumes_from_its_checkpoint(tmp_path):
    model = SpanModel.warm_start(SpanConfig(n_passages=2, max_passage_tokens=48))
    cfg = TrainConfig(lr=1e-4, batch_size=1, max_epochs=1, eval_every=1, patience=10)
    first = ReaderTrainer(model, "extractive", cfg, tmp_path / "run").train(examples(), examples())
    assert first.steps == 2 and len(first.history) == 2
    # A second run over the same folder with more epochs starts where the first stopped.
    cfg2 = TrainConfig(lr=1e-4, batch_size=1, max_epochs=2, eval_every=1, patience=10)
    fresh = SpanModel.warm_start(SpanConfig(n_passages=2, max_passage_tokens=48))
    second = ReaderTrainer(fresh, "extractive", cfg2, tmp_path / "run").train(examples(), examples())
    assert second.steps == 4
    assert [h["step"] for h in second.history] == [1, 2, 3, 4]


@pytest.mark.integration
def test_trainer_stops_early_when_validation_stalls(tmp_path):
    model = SpanModel.warm_start(SpanConfig(n_passages=2, max_passage_tokens=48))
    cfg = TrainConfig(lr=0.0, batch_size=1, max_epochs=5, eval_every=1, patience=2)  # lr 0: never improves
    result = ReaderTrainer(model, "extractive", cfg, tmp_path / "run").train(examples(), examples())
    assert result.stopped == "early stopping"
    assert result.steps == 3  # the first evaluation sets the best, two more without gain stop it


@pytest.mark.integration
def test_trained_folder_loads_as_named_reader(tmp_path):
    model = SpanModel.warm_start(SpanConfig(n_passages=2, max_passage_tokens=48))
    model.save(tmp_path / "v1")
    with pytest.raises(FileNotFoundError, match="reader.json"):
        read_reader_info(tmp_path / "v1")
    with pytest.raises(ValueError, match="unknown"):
        write_reader_info(tmp_path / "v1", {"kind": "gpt"})
    write_reader_info(tmp_path / "v1", {"kind": "extractive", "version": "extractive-test-1"})
    reader = load_trained_reader(tmp_path / "v1", max_passages=1)
    assert reader.name == "extractive:extractive-test-1"
    assert reader.n_passages == 1
