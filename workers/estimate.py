"""`sqa estimate`: how well would the service do on new questions? Estimates from a pool of
question quarters under four split strategies (evaluation/splits.py), compared with the truth of a
new sample (a later quarter), as in Søgaard et al.'s Table 2.

The learner trained on each split is the candidate ranker (models/candidates.py): fast enough to
train once per split. Every question is retrieved once, as of its own date, with the serving
index, and the retrieved passages are annotated with spaCy once; both go to a cache file under
SQA_HOME/work/estimate/ that is appended as it goes, so an interrupted run resumes where it stopped
(workers/ranker_items.py, shared with `sqa train reader --kind ranker`).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from evaluation.splits import (
    STRATEGIES,
    Split,
    adversarial_splits,
    length_split,
    random_splits,
    run_splits,
    summarise,
    temporal_split,
)
from evaluation.temporal import quarter_bounds, quarter_index, quarter_range
from models.candidates import CandidateRanker, MajorityAnswer, RankerItem, mean_f1
from store.tables import Question
from workers.progress import Progress
from workers.ranker_items import prepare_items
from workers.reader_data import gold_questions

if TYPE_CHECKING:
    from workers.job_context import JobContext

log = logging.getLogger(__name__)

MIN_POOL = 10  # fewer usable pool questions cannot give a train part and a test part worth scoring


@dataclass(frozen=True)
class EstimateConfig:
    pool: tuple[str, ...]  # question quarters, e.g. ("2022Q3", "2022Q4")
    new: str  # the new sample's quarter (later than every pool quarter)
    strategies: tuple[str, ...] = STRATEGIES
    k: int = 5  # repeats of the random and adversarial strategies
    test_fraction: float = 0.1
    passages: int = 10  # retrieved passages per question the ranker reads
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.pool:
            raise ValueError("the pool needs at least one quarter")
        for q in (*self.pool, self.new):
            quarter_index(q)  # a clear error for a malformed quarter
        if quarter_index(self.new) <= max(quarter_index(q) for q in self.pool):
            raise ValueError(f"the new sample {self.new} must come after every pool quarter ({', '.join(self.pool)})")
        unknown = set(self.strategies) - set(STRATEGIES)
        if unknown:
            raise ValueError(f"unknown split strategies {sorted(unknown)} (use {', '.join(STRATEGIES)})")
        if self.k < 2:
            raise ValueError(f"k must be at least 2 to show a spread, got {self.k}")


def parse_pool(value: str) -> tuple[str, ...]:
    """ "2022Q3,2022Q4" or a range "2022Q3..2023Q1" -> quarters in order."""
    value = value.strip()
    if ".." in value:
        first, last = value.split("..", 1)
        return tuple(quarter_range(first.strip(), last.strip()))
    quarters = tuple(q.strip() for q in value.split(",") if q.strip())
    for q in quarters:
        quarter_index(q)
    return tuple(sorted(set(quarters), key=quarter_index))


def _questions(session, quarters: Sequence[str]) -> list[Question]:
    """The generation-subset questions of the quarters, in date order."""
    out = []
    for quarter in quarters:
        first, last = quarter_bounds(quarter)
        out += gold_questions(session, first, last + dt.timedelta(days=1))[0]
    return out


def make_splits(cfg: EstimateConfig, pool: list[RankerItem], embeddings: np.ndarray | None, n_new: int) -> list[Split]:
    splits: list[Split] = []
    for strategy in cfg.strategies:
        if strategy == "random":
            splits += random_splits(len(pool), k=cfg.k, test_fraction=cfg.test_fraction, seed=cfg.seed)
        elif strategy == "length":
            splits += length_split([len(i.question.split()) for i in pool], test_fraction=cfg.test_fraction)
        elif strategy == "adversarial":
            splits += adversarial_splits(embeddings, k=cfg.k, test_fraction=cfg.test_fraction, seed=cfg.seed)
        else:
            splits += temporal_split(len(pool), n_new)
    return splits


def score_splits(splits: Sequence[Split], pool: list[RankerItem], new: list[RankerItem], seed: int = 0):
    """Train the ranker and the trivial baseline on each split's train part; F1 on its test part."""

    def evaluate(split: Split) -> tuple[float, float]:
        train = [pool[i] for i in split.train]
        test = [(new if split.strategy == "temporal" else pool)[i] for i in split.test]
        ranker = CandidateRanker(seed=seed).fit(train)
        baseline = MajorityAnswer().fit(train)
        return mean_f1(ranker.predict(test), test), mean_f1(baseline.predict(test), test)

    return run_splits(splits, evaluate)


def run_estimate(ctx: JobContext, cfg: EstimateConfig, progress: Progress) -> dict:
    """Everything `sqa estimate` prints: the per-strategy table, every split's score, the counts."""
    with ctx.sessions() as session:
        pool_q = _questions(session, cfg.pool)
        new_q = _questions(session, [cfg.new]) if "temporal" in cfg.strategies else []
        session.expunge_all()
    if len(pool_q) < MIN_POOL:
        raise ValueError(
            f"the pool {', '.join(cfg.pool)} has {len(pool_q)} usable questions; import more "
            "(`sqa import realtimeqa ...`) or widen --pool"
        )
    if "temporal" in cfg.strategies and not new_q:
        raise ValueError(f"the new sample {cfg.new} has no usable questions")
    adversarial = "adversarial" in cfg.strategies  # the only strategy that needs question embeddings
    items, vectors = prepare_items(ctx, pool_q + new_q, cfg.passages, progress, embed=adversarial)
    pool = [items[q.qid] for q in pool_q]
    new = [items[q.qid] for q in new_q]
    splits = make_splits(cfg, pool, vectors[: len(pool)] if adversarial else None, len(new))
    progress.stage("train+score", len(splits))
    scores = []
    for split in splits:
        scores += score_splits([split], pool, new, cfg.seed)
        progress.advance(1)
    return {
        "config": {**asdict(cfg), "pool": list(cfg.pool), "strategies": list(cfg.strategies)},
        "counts": {
            "pool": len(pool),
            "new": len(new),
            "pool_first": min(q.asked for q in pool_q).isoformat(),
            "new_last": max(q.asked for q in new_q).isoformat() if new_q else None,
        },
        "table": summarise(scores),
        "splits": [asdict(s) for s in scores],
        "computed_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
