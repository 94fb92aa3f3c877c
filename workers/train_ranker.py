"""`sqa train reader --until D --kind ranker`: fit the candidate ranker reader (models/ranker.py).

Data: the gold questions dated before the cut (generation subset), each retrieved as of its own
date with the serving index and annotated with spaCy (workers/ranker_items.py: cached, so a rerun
resumes and reuses what `sqa estimate` already retrieved), optionally plus self-labeled questions
generated from the articles published before the cut. Validation: the gold questions of the last
month before the cut, never anything after it; the regularisation strength is chosen on it. The
result is a version folder (`ranker.json` + `reader.json`) and a `reader_models` row of kind
"ranker", like the other kinds.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import shutil
import time
from dataclasses import asdict
from typing import TYPE_CHECKING

from evaluation.questions import DatedQuestion
from indexer.dates import month_key, month_start
from models.candidates import CandidateRanker, RankerItem, candidates, is_positive
from models.ranker import RankerConfig, RankerModel
from models.trained import write_reader_info
from serving.reader_registry import new_version_name, register_version
from workers.ranker_items import prepare_items
from workers.runner import JobHandle

if TYPE_CHECKING:
    from workers.job_context import JobContext

log = logging.getLogger(__name__)

C_GRID = (1.0, 0.3, 3.0, 0.1)  # tried in this order; ties keep the earlier one
PASSAGES = 10  # passages read per question (training and serving), as `sqa estimate` reads
SELF_ARTICLES = 0  # articles sampled for self-labeled questions by default (0: gold questions only)


def self_question(g) -> DatedQuestion:
    """A self-labeled question as an item question; its id is a digest of what it is, so a cached
    item never belongs to a different question."""
    key = hashlib.sha256(f"{g.url}|{g.published}|{g.question}|{g.answer}".encode()).hexdigest()[:16]
    return DatedQuestion(f"self-{key}", g.question, g.published, (g.answer,))


def reachable(items: list[RankerItem]) -> float:
    """The share of items with a candidate that matches a gold answer: the ranker's ceiling, in %."""
    if not items:
        return 0.0
    hits = sum(any(is_positive(c.text, i.answers) for c in candidates(i)) for i in items)
    return round(100.0 * hits / len(items), 2)


def fit_ranker(
    train: list[RankerItem], val: list[RankerItem], *, seed: int = 0, grid: tuple[float, ...] = C_GRID, progress=None
) -> tuple[CandidateRanker, dict, list[dict]]:
    """Fit one ranker per C (without retrieval scores: a reader gets none) and keep the best on val.

    Returns:
        (the best ranker, its validation {"n", "em", "f1"}, every C's {"c", "em", "f1"}).
    """
    from models.training import score_predictions  # noqa: PLC0415 (lazy: models.training imports torch)

    if progress:
        progress.stage("fit", len(grid))
    best, best_val, history = None, None, []
    for c in grid:
        ranker = CandidateRanker(c=c, seed=seed, use_score=False).fit(train)
        scores = score_predictions(ranker.predict(val), val) if val else {"n": 0, "em": 0.0, "f1": 0.0}
        history.append({"c": c, **scores})
        if best_val is None or scores["f1"] > best_val["f1"]:
            best, best_val = ranker, scores
        if progress:
            progress.advance()
    return best, best_val, history


def run_ranker_job(ctx: JobContext, job: JobHandle, *, until: dt.date, spec, data, activate: bool | None = None) -> str:
    """Train, save and register a ranker version on what is dated before `until`; returns its name.

    Args:
        spec: a workers.reader_spec.ReaderJobSpec of kind "ranker" (`infer_passages`: passages read per
            question, in training and serving; `max_self_articles`: 0 for gold questions only).
        data: its DataConfig (self-labeled questions per article, seed).
    """
    from workers.reader_data import gold_questions, indexed_start, self_labeled, serving_snapshot  # noqa: PLC0415 (lazy: workers.reader_data imports torch)

    val_from = month_start(until - dt.timedelta(days=1))
    db, progress = ctx.db, job
    t0 = time.perf_counter()
    encoder, snapshot = serving_snapshot(ctx)
    first = indexed_start(snapshot)
    if first >= val_from:
        raise ValueError(
            f"the index starts {first}: ingest months before {month_key(val_from)} to train "
            f"(validation uses {month_key(val_from)})"
        )
    with db.sessions() as session:
        golds, left_out = gold_questions(session, first, until)
        selfq = [self_question(g) for g in self_labeled(session, first, until, data)] if spec.max_self_articles else []
        session.expunge_all()
    train_q = [q for q in golds if q.asked < val_from]
    val_q = [q for q in golds if q.asked >= val_from]
    items, _ = prepare_items(ctx, train_q + val_q + selfq, spec.infer_passages, progress, embed=False)
    train = [items[q.qid] for q in train_q + selfq]
    val = [items[q.qid] for q in val_q]
    counts = {
        "train": len(train),
        "val": len(val),
        "gold": len(train_q),
        "self_labeled": len(selfq),
        "left_out": dict(left_out),
        "reachable_train": reachable(train),
        "reachable_val": reachable(val),
    }
    log.info("ranker training data: %s", counts)
    if not train_q and not selfq:
        raise ValueError(
            f"no training questions dated {first}..{val_from}: import questions "
            "(`sqa import realtimeqa ...`) or move --until later"
        )
    t1 = time.perf_counter()
    ranker, validation, history = fit_ranker(train, val, seed=spec.seed, progress=progress)
    version = new_version_name("ranker", str(until))
    dest = ctx.models_dir / version
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    RankerModel(ranker, RankerConfig(n_passages=spec.infer_passages, c=ranker.c, seed=spec.seed)).save(tmp)
    fit_s = round(time.perf_counter() - t1, 1)
    info = {
        "kind": "ranker",
        "version": version,
        "parent_version": None,
        "trained_until": until.isoformat(),
        "month": None,
        "spec": asdict(spec),
        "data": counts,
        "validation": validation,
        "history": history,
        "stopped": "fitted",
        "steps": 0,
        "train_seconds": fit_s,
    }
    write_reader_info(tmp, info)
    tmp.replace(dest)
    with db.sessions() as session, session.begin():
        make_active = bool(activate)  # a new version serves only once someone activates it
        register_version(
            session,
            version=version,
            kind="ranker",
            path=version,
            trained_until=until,
            job_id=job.job_id,
            activate=make_active,
            models_dir=ctx.models_dir,
            metrics={"validation": validation, "train": len(train), "val": len(val), "c": ranker.c},
        )
        job.update_in(
            session,
            counts={**counts, "version": version, "activated": make_active, "validation": validation},
            timings={"data_s": round(t1 - t0, 1), "train_s": fit_s},
        )
    return version
