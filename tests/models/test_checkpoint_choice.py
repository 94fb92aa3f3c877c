"""Which validated model a training keeps: the best, or (keep_within) the earliest close to it; and
(max_steps) where a run stops."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from models.readers import RetrievedPassage
from models.training import ReaderTrainer, TrainConfig, TrainExample

DAY = dt.date(2023, 3, 1)


class Toy(torch.nn.Module):
    """One weight that every step moves: a saved folder tells which step it was saved at."""

    config = SimpleNamespace(n_passages=1)
    device = torch.device("cpu")

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))

    def save(self, folder: Path) -> None:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / "w.json").write_text(json.dumps(self.w.item()))

    @classmethod
    def load(cls, folder: Path, device: str = "cpu") -> Toy:
        toy = cls()
        toy.w.data.fill_(json.loads((Path(folder) / "w.json").read_text()))
        return toy


class Scripted(ReaderTrainer):
    """Every step moves the weight (loss -w: AdamW with lr 1 moves it by about 1); validation F1 comes
    from a script, one value per validation."""

    def __init__(self, f1s: list[float], out_dir: Path, **cfg) -> None:
        self.f1s = list(f1s)
        settings = {"batch_size": 1, "warmup_steps": 1, "eval_every": 1, "patience": 10, **cfg}
        super().__init__(Toy(), "extractive", TrainConfig(**settings), out_dir)

    def batch_loss(self, batch):
        return -self.model.w

    def evaluate(self, examples):
        return {"n": len(examples), "em": 0.0, "f1": self.f1s.pop(0)}


def run(tmp_path: Path, f1s: list[float], **cfg):
    trainer = Scripted(f1s, tmp_path / "run", lr=1.0, **{"max_epochs": len(f1s), **cfg})
    data = [TrainExample("q", "Who?", DAY, ("Ada",), (RetrievedPassage("t", "Ada.", DAY),))]
    result = trainer.train(data, data)
    saved_w = json.loads((trainer.best_dir / "w.json").read_text())
    return trainer, result, saved_w


def weight_at(tmp_path: Path, step: int) -> float:
    return json.loads((tmp_path / "run" / "validated" / f"step-{step}" / "w.json").read_text())


def test_by_default_the_best_validation_is_kept_and_nothing_else_saved(tmp_path):
    trainer, result, saved_w = run(tmp_path, [40.0, 42.0, 30.0, 20.0])
    assert result.best_step == 2 and result.best["f1"] == 42.0 and result.top == {}
    assert not trainer.validated_dir.exists()


def test_keep_within_keeps_the_earliest_model_close_to_the_best(tmp_path):
    trainer, result, saved_w = run(tmp_path, [40.0, 42.0, 30.0, 20.0], keep_within=3.0)
    assert result.best_step == 1 and result.best["f1"] == 40.0
    assert result.top["step"] == 2 and result.top["f1"] == 42.0
    # best/ holds the model as it was at step 1, not step 2's
    assert saved_w == pytest.approx(weight_at(tmp_path, 1))
    assert saved_w != pytest.approx(weight_at(tmp_path, 2))


def test_keep_within_keeps_the_best_when_no_earlier_model_is_close(tmp_path):
    trainer, result, saved_w = run(tmp_path, [30.0, 42.0, 41.0], keep_within=3.0)
    assert result.best_step == 2 and result.top == {}
    assert saved_w == pytest.approx(weight_at(tmp_path, 2))


def test_an_earlier_model_that_was_not_kept_is_passed_over(tmp_path):
    """A run resumed under keep_within from validations made without it has no folder for them."""
    trainer = Scripted([], tmp_path / "run", keep_within=3.0)
    trainer.best_dir.mkdir(parents=True)
    (trainer.best_dir / "w.json").write_text("2.0")
    (trainer.validated_dir / "step-3").mkdir(parents=True)
    (trainer.validated_dir / "step-3" / "w.json").write_text("3.0")
    history = [{"step": 1, "f1": 41.0}, {"step": 2, "f1": 42.0}, {"step": 3, "f1": 40.0}]
    state = {"history": history, "best": history[1], "best_f1": 42.0, "best_step": 2}
    assert trainer._keep_earliest_within(state) == history[1]  # step 1 has no folder; step 3 is later
    assert (trainer.best_dir / "w.json").read_text() == "2.0"


def test_max_steps_stops_there_with_a_validation_and_the_uncapped_runs_model(tmp_path):
    """Capped at step 2 with validations every 3 steps: it validates at 2 all the same, and what it keeps
    is what an uncapped run held at step 2 (the learning rate still runs over the epochs)."""
    trainer, result, saved_w = run(tmp_path / "capped", [40.0], eval_every=3, max_steps=2, max_epochs=5)
    assert (result.steps, result.stopped, result.best_step) == (2, "max steps", 2)
    assert [h["step"] for h in result.history] == [2]
    _, uncapped, _ = run(tmp_path / "uncapped", [10.0, 20.0, 30.0, 40.0, 50.0], keep_within=0.5)
    assert uncapped.steps == 5 and uncapped.stopped == "epochs"
    assert saved_w == pytest.approx(weight_at(tmp_path / "uncapped", 2))
    # Run again (a resume): the cap was reached, so nothing more trains and the same model stays.
    again = Scripted([], tmp_path / "capped" / "run", lr=1.0, eval_every=3, max_steps=2, max_epochs=5)
    data = [TrainExample("q", "Who?", DAY, ("Ada",), (RetrievedPassage("t", "Ada.", DAY),))]
    resumed = again.train(data, data)
    assert (resumed.steps, resumed.stopped, resumed.best_step) == (2, "max steps", 2)
    assert json.loads((again.best_dir / "w.json").read_text()) == pytest.approx(saved_w)


def test_a_cap_past_the_epochs_changes_nothing(tmp_path):
    _, result, _ = run(tmp_path, [40.0, 42.0, 30.0], max_steps=10)
    assert result.steps == 3 and result.stopped == "epochs" and result.best_step == 2


def test_a_capped_runs_progress_ends_at_its_cap(tmp_path):
    trainer = Scripted([40.0], tmp_path / "run", lr=1.0, eval_every=3, max_steps=2, max_epochs=5)
    data = [TrainExample("q", "Who?", DAY, ("Ada",), (RetrievedPassage("t", "Ada.", DAY),))]
    seen = []
    trainer.train(data, data, progress=lambda fraction, message: seen.append((fraction, message)))
    assert seen[-1][0] == 1.0 and seen[-1][1].startswith("step 2/2 validation")
