"""Training loop shared by the trained readers (FiD, the extractive span reader, fine-tuned Gemma).

Plain PyTorch: AdamW with linear warm-up and decay, gradient clipping, validation by EM/F1 every
`eval_every` steps, early stopping on validation F1, a wall-clock budget, and checkpoints that
resume exactly (model, optimiser, scheduler, step, data order, best score).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from evaluation.metrics import exact_match, token_f1
from indexer.atomic import replace_folder
from indexer.chunking import strip_date_prefix
from models.reader_base import RetrievedPassage

log = logging.getLogger(__name__)

KINDS = ("fid", "extractive", "gemma")  # the trained reader kinds with a network (ranker has none)


@dataclass(frozen=True)
class TrainExample:
    qid: str
    question: str
    as_of: dt.date
    answers: tuple[str, ...]
    passages: tuple[RetrievedPassage, ...]  # retrieval order, gold-containing passage ensured
    source: str = "gold"  # "gold" | "self" (self-labeled)

    def to_json(self) -> dict:
        return {
            "qid": self.qid,
            "question": self.question,
            "as_of": self.as_of.isoformat(),
            "answers": list(self.answers),
            "source": self.source,
            "passages": [
                {"title": p.title, "body": p.text, "published": p.published.isoformat()} for p in self.passages
            ],
        }

    @classmethod
    def from_json(cls, d: dict) -> TrainExample:
        return cls(
            d["qid"],
            d["question"],
            dt.date.fromisoformat(d["as_of"]),
            tuple(d["answers"]),
            tuple(_passage(p) for p in d["passages"]),
            d.get("source", "gold"),
        )


def _passage(d: dict) -> RetrievedPassage:
    """A passage of a saved example: its "body", or (examples saved before passages were stored as
    bodies) its "text" with the date prefix that text carried taken off."""
    published = dt.date.fromisoformat(d["published"])
    body = d["body"] if "body" in d else strip_date_prefix(d["text"], published)
    return RetrievedPassage(d["title"], body, published)


def save_examples(path: Path, examples: Sequence[TrainExample]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with tmp.open("w") as f:
        for ex in examples:
            f.write(json.dumps(ex.to_json()) + "\n")
    tmp.replace(path)


def load_examples(path: Path) -> list[TrainExample]:
    with path.open() as f:
        return [TrainExample.from_json(json.loads(line)) for line in f if line.strip()]


@dataclass(frozen=True)
class TrainConfig:
    lr: float = 1e-4
    batch_size: int = 2  # questions per step (each with n_passages passages)
    max_epochs: int = 3
    warmup_steps: int = 50
    eval_every: int = 200  # steps
    patience: int = 3  # evaluations without a better validation F1 before stopping
    max_minutes: float = 0.0  # wall-clock budget for this run (0: none)
    grad_clip: float = 1.0
    seed: int = 0
    n_passages: int = 0  # passages per question in training (0: the model's own setting)
    eval_at_start: bool = False  # validate before the first step too (the zero-shot score, for a pretrained LM)
    # F1 points: keep the earliest validated model whose validation F1 is within this of the best, not
    # the best itself (0: the best). On a few dozen validation questions a later step's small gain is
    # noise more often than not; every validated model is kept in validated/ until the run ends.
    keep_within: float = 0.0
    # Stop after this many steps, validating there (0: the epochs, early stopping and the budget decide).
    # The learning-rate schedule still runs over the epochs, so the first max_steps steps are the same
    # as an uncapped run's.
    max_steps: int = 0


@dataclass
class TrainResult:
    steps: int
    epochs_done: float
    best_step: int
    best: dict  # validation metrics of the best checkpoint
    history: list[dict] = field(default_factory=list)
    stopped: str = ""  # "early stopping" | "budget" | "max steps" | "epochs"
    seconds: float = 0.0
    top: dict = field(default_factory=dict)  # the best-scoring validation, where `best` is an earlier one kept


Progress = Callable[[float, str], None]


def score_predictions(predictions: Sequence[str], examples: Sequence[TrainExample]) -> dict:
    n = len(examples)
    if n == 0:
        return {"n": 0, "em": 0.0, "f1": 0.0}
    em = sum(exact_match(p, list(ex.answers)) for p, ex in zip(predictions, examples)) / n
    f1 = sum(token_f1(p, list(ex.answers)) for p, ex in zip(predictions, examples)) / n
    return {"n": n, "em": round(100 * em, 2), "f1": round(100 * f1, 2)}


class ReaderTrainer:
    """Trains a FiDModel, a SpanModel or a GemmaModel; `kind` picks how a batch becomes a loss or
    predictions."""

    def __init__(self, model, kind: str, cfg: TrainConfig, out_dir: Path, clock=time.monotonic) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind {kind!r} is unknown")
        self.model, self.kind, self.cfg, self.out_dir = model, kind, cfg, Path(out_dir)
        self.clock = clock  # seconds, for the budget and the timings (tests pass their own)
        self.n = cfg.n_passages or model.config.n_passages

    # ---- the kinds ----------------------------------------------------------------------
    def _items(self, batch: Sequence[TrainExample]):
        return [(ex.question, ex.as_of, ex.passages[: self.n]) for ex in batch]

    def batch_loss(self, batch: Sequence[TrainExample]) -> torch.Tensor | None:
        if self.kind == "fid":
            ids, mask = self.model.encode_inputs(self._items(batch), self.n)
            labels = self.model.encode_answers([ex.answers[0] for ex in batch])
            return self.model.loss(ids, mask, labels)
        if self.kind == "gemma":  # a causal LM: cross-entropy of the first answer after the prompt
            return self.model.loss(self._items(batch), [ex.answers[0] for ex in batch])
        span = self.model.encode_inputs(self._items(batch), self.n)
        return self.model.loss(span, [ex.answers for ex in batch])

    def predict(self, examples: Sequence[TrainExample], batch_size: int = 8) -> list[str]:
        self.model.eval()
        if self.kind == "gemma":  # in one call: it batches by itself (on a CPU, one served copy answers all)
            return self.model.generate(self._items(examples))
        out: list[str] = []
        for i in range(0, len(examples), batch_size):
            items = self._items(examples[i : i + batch_size])
            if self.kind == "fid":
                out.extend(self.model.generate(items, self.n))
            else:
                out.extend(t for t, _ in self.model.extract(items, self.n))
        return out

    def evaluate(self, examples: Sequence[TrainExample]) -> dict:
        return score_predictions(self.predict(examples), examples)

    # ---- checkpoints --------------------------------------------------------------------
    @property
    def ckpt_dir(self) -> Path:
        return self.out_dir / "checkpoint"

    @property
    def best_dir(self) -> Path:
        return self.out_dir / "best"

    @property
    def validated_dir(self) -> Path:
        return self.out_dir / "validated"

    def _save_checkpoint(self, opt, sched, state: dict) -> None:
        def write(tmp: Path) -> None:
            self.model.save(tmp / "model")
            torch.save({"opt": opt.state_dict(), "sched": sched.state_dict(), **state}, tmp / "state.pt")

        replace_folder(self.ckpt_dir, write)

    def _save_best(self) -> None:
        replace_folder(self.best_dir, self.model.save)

    # ---- the loop -----------------------------------------------------------------------
    def _validate(
        self,
        val: Sequence[TrainExample],
        state: dict,
        loss: torch.Tensor | None,
        t0: float,
        total: int,
        progress: Progress | None,
    ) -> None:
        """Score the validation set at the current step, record it, keep the model in best/ if better."""
        step = state["step"]
        metrics = self.evaluate(val) if val else {"n": 0, "em": 0.0, "f1": 0.0}
        metrics.update(
            step=step,
            loss=round(float(loss.item()) if loss is not None else 0.0, 4),
            minutes=round((self.clock() - t0) / 60, 2),
            s_per_step=round(state.get("step_seconds", 0.0) / step, 2) if step else 0.0,
        )
        state["history"].append(metrics)
        log.info("eval %s", metrics)
        if progress:
            progress(step / total, f"step {step}/{total} validation EM {metrics['em']} F1 {metrics['f1']}")
        if self.cfg.keep_within > 0:
            replace_folder(self.validated_dir / f"step-{step}", self.model.save)
        if metrics["f1"] > state["best_f1"] or not state["best"]:
            state.update(best_f1=metrics["f1"], best_step=step, best=metrics, bad_evals=0)
            self._save_best()
        else:
            state["bad_evals"] += 1
        state["seconds"] = self.clock() - t0

    def _keep_earliest_within(self, state: dict) -> dict:
        """With `keep_within`: put the earliest validated model within that many F1 points of the best
        in best/, and return its metrics (the best's where no earlier one is close enough, or where the
        earlier ones were validated without being kept: a run resumed from a checkpoint of another rule)."""
        if self.cfg.keep_within <= 0 or not state["best"]:
            return state["best"]
        kept = next(
            h
            for h in state["history"]
            if h["f1"] >= state["best_f1"] - self.cfg.keep_within
            and (h["step"] == state["best_step"] or (self.validated_dir / f"step-{h['step']}").is_dir())
        )
        if kept["step"] != state["best_step"]:
            src = self.validated_dir / f"step-{kept['step']}"
            replace_folder(self.best_dir, lambda tmp: shutil.copytree(src, tmp, dirs_exist_ok=True))
            log.info(
                "keeping step %d (validation F1 %s), within %s F1 points of step %d's %s",
                kept["step"],
                kept["f1"],
                self.cfg.keep_within,
                state["best_step"],
                state["best_f1"],
            )
        return kept

    def train(
        self, train: Sequence[TrainExample], val: Sequence[TrainExample], progress: Progress | None = None
    ) -> TrainResult:
        """Train to the end (epochs, early stopping, budget or max_steps); resumes from `checkpoint/` when
        one exists. The best model by validation F1 is left in `best/`."""
        cfg = self.cfg
        if not train:
            raise ValueError("no training examples")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        steps_per_epoch = math.ceil(len(train) / cfg.batch_size)
        total = steps_per_epoch * cfg.max_epochs
        opt = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.01)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / max(1, cfg.warmup_steps)) * max(0.0, 1 - s / max(1, total))
        )
        state = {
            "step": 0,
            "best_f1": -1.0,
            "best_step": 0,
            "best": {},
            "bad_evals": 0,
            "history": [],
            "seconds": 0.0,
            "step_seconds": 0.0,
        }
        if (self.ckpt_dir / "state.pt").exists():
            saved = torch.load(self.ckpt_dir / "state.pt", map_location="cpu", weights_only=False)
            reloaded = type(self.model).load(self.ckpt_dir / "model", device=str(self.model.device))
            self.model.load_state_dict(reloaded.state_dict())
            opt.load_state_dict(saved.pop("opt"))
            sched.load_state_dict(saved.pop("sched"))
            state.update(saved)
            log.info("resuming from step %d", state["step"])
        t0 = self.clock() - state["seconds"]
        last = min(total, cfg.max_steps) if cfg.max_steps > 0 else total
        if cfg.eval_at_start and val and state["step"] == 0 and not state["history"]:
            self._validate(val, state, None, t0, last, progress)  # step 0: the score before training
        stopped = "epochs"
        if last < total and state["step"] >= last:
            stopped = "max steps"  # resumed after the cap's validation: nothing left to train
        while state["step"] < last:
            epoch, offset = divmod(state["step"], steps_per_epoch)
            order = list(range(len(train)))
            random.Random(cfg.seed + epoch).shuffle(order)
            self.model.train()
            for s in range(offset, steps_per_epoch):
                batch = [train[i] for i in order[s * cfg.batch_size : (s + 1) * cfg.batch_size]]
                t_step = self.clock()
                loss = self.batch_loss(batch)
                if loss is not None:
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
                    opt.step()
                opt.zero_grad(set_to_none=True)
                sched.step()
                state["step_seconds"] += self.clock() - t_step
                state["step"] += 1
                step = state["step"]
                if progress and step % 10 == 0:
                    progress(step / last, f"step {step}/{last} loss {loss.item() if loss is not None else 0:.3f}")
                over_budget = cfg.max_minutes and self.clock() - t0 > cfg.max_minutes * 60
                if (
                    over_budget
                    and state["history"]
                    and step < last
                    and step - state["history"][-1]["step"] < max(1, cfg.eval_every // 5)
                ):
                    # The budget ran out a few steps after a validation: another would cost as long as
                    # many steps (minutes for Gemma on a CPU) to score a model barely moved; the best
                    # scored so far stands. The checkpoint keeps these steps for a resumed run.
                    state["seconds"] = self.clock() - t0
                    self._save_checkpoint(opt, sched, state)
                    stopped = "budget"
                    break
                if step % cfg.eval_every == 0 or step == last or over_budget:
                    self._validate(val, state, loss, t0, last, progress)  # progress: of the steps it will run
                    self._save_checkpoint(opt, sched, state)
                    self.model.train()
                    if state["bad_evals"] >= cfg.patience:
                        stopped = "early stopping"
                    elif over_budget:
                        stopped = "budget"
                    elif step == last < total:
                        stopped = "max steps"
                    if stopped != "epochs":
                        break
            if stopped != "epochs":
                break
        kept = self._keep_earliest_within(state)
        return TrainResult(
            steps=state["step"],
            epochs_done=round(state["step"] / steps_per_epoch, 2),
            best_step=kept.get("step", state["best_step"]),
            best=kept,
            history=state["history"],
            stopped=stopped,
            seconds=round(self.clock() - t0, 1),
            top=state["best"] if kept.get("step") != state["best_step"] else {},
        )
