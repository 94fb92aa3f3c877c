"""What a reader training job trains (`sqa train reader`, `sqa finetune`, `sqa train auto`): its
kind, passages, loop and data settings in one `ReaderJobSpec`, with the defaults that suit Gemma
(`ReaderJobSpec.for_gemma`) and a fine-tune (`for_finetune`). The jobs are workers/train.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from models.gemma_config import GemmaConfig
from models.training import TrainConfig
from workers.reader_data import DataConfig

# F1 points on the held-back month's validation questions (65 gold ones of March for the 2023-04-01 cut):
# a later checkpoint that scores less than this above an earlier one is not kept. Between two checkpoints
# of one run, about 7% of questions flip, so on 65 questions a difference of 3 points is one standard
# error. It matters only where a run goes on past its first validation (`max_steps=0`).
GEMMA_KEEP_WITHIN = 3.0

# Steps of a first Gemma training (4 questions a step): it stops at its first validation. In four runs
# (docs/reader-experiments.md, "Which checkpoint to keep"), the step-50 model scored on the next
# quarter at least as well as the checkpoint the validation would have kept (7 and 4 of 353
# questions better in the two runs where the two differ), and 1.3 EM points better than step 100 on
# average (one run of four the other way):
# March's few dozen questions do not rank the later checkpoints. The run takes about 9 minutes instead
# of 20-30. A fine-tune of a trained version is not capped (run_finetune_job).
GEMMA_MAX_STEPS = 50


@dataclass(frozen=True)
class ReaderJobSpec:
    kind: str = "fid"  # fid | extractive | gemma | ranker (workers/train_ranker.py)
    n_passages: int = 5  # in training; inference uses `infer_passages`
    infer_passages: int = 10
    max_passage_tokens: int = 192
    backbone: str = "minilm"  # fid only: minilm | seq2seq
    base: str = ""  # fid seq2seq: a local T5/BART folder
    method: str = "lora"  # gemma only: lora | last-layers (models.gemma_train)
    titles: bool = False  # gemma only: passages carry their article's headline (models.reader_context.add_titles)
    # gemma only: 0 reads the first 100 words of each passage; N the sentences of the passages that bear on
    # the question, N words in all (models.reader_context.select_context), in training and in serving
    context_words: int = 0
    max_length: int = 320  # gemma only: training tokens per example, passages cut to fit (0: the served prompt whole)
    lr: float = 0.0  # 0: the kind's default
    batch_size: int = 2
    max_epochs: int = 3
    warmup_steps: int = 50
    eval_every: int = 200
    patience: int = 3
    keep_within: float = 0.0  # F1 points (models.training.TrainConfig.keep_within; 0: keep the best)
    max_steps: int = 0  # stop there, validating (models.training.TrainConfig.max_steps; 0: no cap)
    max_minutes: float = 0.0
    max_self_articles: int = 600
    self_per_article: int = 2  # self-labeled questions asked of each sampled article (at most one a sentence)
    seed: int = 0
    gold: bool = True  # False: learn from self-labeled questions only (workers.reader_data.DataConfig.gold)
    # gemma only: score the model before the first step too, so the run keeps the starting weights when
    # training makes them worse. False where the caller compares against the serving reader itself
    # (`sqa train auto`): for the untrained base that pass costs minutes of a short budget.
    validate_first: bool = True

    @property
    def learning_rate(self) -> float:
        """`lr`, or the kind's default: the FiD decoder's fresh cross-attention wants more, and so do
        Gemma's LoRA adapters (its pretrained layers, when trained themselves, want less)."""
        if self.lr:
            return self.lr
        if self.kind == "gemma":
            return 2e-4 if self.method == "lora" else 2e-5
        return 2e-4 if self.kind == "fid" else 5e-5

    @classmethod
    def for_gemma(cls, **overrides) -> ReaderJobSpec:
        """The defaults that suit Gemma 3 270M on CPU: 5 passages in training and serving (on 2023-04..06,
        EM 29.5 against 26.9 for 3 on one store, reading 1.7x slower; zero-shot Gemma keeps 3), 4
        questions a step, frequent validation and a short warm-up (a step takes seconds, and a
        30-minute budget is a hundred or two of them), fewer self-labeled articles, a stop at the first
        validation (GEMMA_MAX_STEPS) and, where a run goes on past it (`max_steps=0`), the earliest
        validated model within GEMMA_KEEP_WITHIN F1 points of the best kept."""
        values = dict(
            kind="gemma",
            n_passages=5,
            infer_passages=5,
            batch_size=4,
            eval_every=50,
            warmup_steps=10,
            max_self_articles=300,
            titles=True,
            keep_within=GEMMA_KEEP_WITHIN,
            max_steps=GEMMA_MAX_STEPS,
        )
        return cls(**{**values, **overrides})

    def for_finetune(self, **overrides) -> ReaderJobSpec:
        """This spec as a fine-tune of a trained version: half its learning rate, one epoch, an earlier
        stop (patience 2) and no step cap (GEMMA_MAX_STEPS caps a first training; a fine-tune's budget
        decides). `overrides` win."""
        values = dict(lr=self.learning_rate / 2, max_epochs=1, patience=2, max_steps=0)
        return replace(self, **{**values, **overrides})

    def gemma_config(self):
        """The Gemma model settings this spec implies (gemma only): its passages as served, method,
        headlines, context and training length."""
        return GemmaConfig(
            n_passages=self.infer_passages,
            method=self.method,
            titles=self.titles,
            max_length=self.max_length,
            context_words=self.context_words,
        )

    def data_config(self, data: DataConfig | None = None) -> DataConfig:
        """The data settings this spec implies (its passages, articles and seed win)."""
        return replace(
            data or DataConfig(),
            n_passages=self.n_passages,
            max_self_articles=self.max_self_articles,
            self_per_article=self.self_per_article,
            seed=self.seed,
            gold=self.gold,
        )

    def train_config(self) -> TrainConfig:
        """The training loop's settings this spec implies."""
        return TrainConfig(
            lr=self.learning_rate,
            batch_size=self.batch_size,
            max_epochs=self.max_epochs,
            warmup_steps=self.warmup_steps,
            eval_every=self.eval_every,
            patience=self.patience,
            keep_within=self.keep_within,
            max_steps=self.max_steps,
            max_minutes=self.max_minutes,
            seed=self.seed,
            n_passages=self.n_passages,
            eval_at_start=self.kind == "gemma" and self.validate_first,
        )
