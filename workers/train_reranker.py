"""`sqa train reranker --until D`: train a cross-encoder re-ranker (models/reranker.py) on what is
dated before the cut, fit its recency prior, and keep it as a version under SQA_HOME/rerankers.

Data: each gold question dated before the held-back month (the month before the cut), asked as of
its date, gets the first stage's top `depth` candidates (the served retriever without re-ranking,
so never a passage published after the question); a candidate that holds a gold answer string is a
positive, and each positive makes a group with `negatives` candidates that hold none (hard negatives:
BM25 and dense results fused). Questions self-labeled from the news before the held-back month add
groups the same way (their answer is the entity their sentence gave).

Validation: the held-back month's gold questions, the same candidates re-ranked: recall@1/5/10 and
MRR against the first stage's own order. The final score adds the first stage's own score and a
recency prior, `ce + f * first_stage - w * log1p(age days)`, with f and w fitted on those questions
from a small grid (f = w = 0 is the cross-encoder alone, also reported). The version is activated when asked to (or by
the training that follows ingestion) only if its recall@5 beats the first stage's there and is above
what its fitted weights reach without the model (`models.reranker.worth_serving`).
Candidates are cached in the job's work folder, keyed by the data config, the index snapshot and the
first stage (`workers.reader_data.retrieval_key`): running the same command
again reuses them, after a new ingest it does not.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import secrets
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from evaluation.metrics import answer_in_text
from indexer.atomic import write_atomic
from indexer.dates import month_key, month_start
from models.gemma_weights import resolve_precision
from models.ltr import FeatureReranker, learnable
from models.reranker import (
    FIRST_STAGE_GRID,
    RECENCY_GRID,
    CrossEncoderReranker,
    RerankerConfig,
    fit_weights,
    groups_of,
    prior_alone,
    ranking_figures,
    worth_serving,
)
from models.train_exported_reranker import EXPORT_FILE, write_export
from serving.reranking import activate_reranker, candidate_of
from workers.progress import fraction_reporter
from workers.reader_data import (
    DataConfig,
    asked_after,
    digest,
    gold_questions,
    indexed_start,
    retrieval_key,
    self_labeled,
    serving_snapshot,
)

if TYPE_CHECKING:
    from workers.job_context import JobContext
    from workers.runner import JobHandle

log = logging.getLogger(__name__)

RERANKER_TRAINING_LOCK = "reranker-training"


@dataclass(frozen=True)
class RerankerDataConfig:
    depth: int = 30  # first-stage candidates per question (SQA_RERANK_DEPTH when serving)
    max_positives: int = 2  # groups per question
    negatives: int = 7
    max_self_articles: int = 300  # articles sampled for self-labeled questions (0: none)
    self_per_article: int = 1  # self-labeled questions kept from each
    max_val: int = 150
    seed: int = 0


def _candidates(session, retriever, snapshot, text: str, asked: dt.date, answers, depth: int) -> list[dict]:
    found = retriever.retrieve(session, snapshot, text, asked, depth)
    return [{**candidate_of(p, asked), "hit": answer_in_text(list(answers), p.text)} for p in found]


def build_items(ctx: JobContext, job: JobHandle, *, until: dt.date, cfg: RerankerDataConfig, encoder, snapshot) -> dict:
    """{"train": [{query, cands}], "val": [...], "counts": {...}} from the first stage's candidates
    over the serving `snapshot` and its `encoder`."""
    held_from = month_start(until - dt.timedelta(days=1))
    first_stage = ctx.make_retriever(encoder, rerank=False)
    start = indexed_start(snapshot)
    if start >= held_from:
        raise ValueError(
            f"the index starts {start}: ingest months before {month_key(held_from)} to train a "
            f"re-ranker (validation uses {month_key(held_from)})"
        )
    rng = random.Random(cfg.seed)
    with ctx.sessions() as session:
        golds, _ = gold_questions(session, start, until)
        train_q = [(q.text, q.asked, tuple(q.answers), "gold") for q in golds if q.asked < held_from]
        val_q = [(q.text, q.asked, tuple(q.answers), "gold") for q in golds if q.asked >= held_from]
        rng.shuffle(val_q)
        val_q = val_q[: cfg.max_val]
        selfq = []
        if cfg.max_self_articles:
            gen = self_labeled(
                session,
                start,
                held_from,
                DataConfig(seed=cfg.seed),
                max_articles=cfg.max_self_articles,
                per_article=cfg.self_per_article,
                progress=job,
            )  # spaCy: ~8 articles a second
            selfq = [
                (g.question, asked_after(g.published, rng, held_from - dt.timedelta(days=1)), (g.answer,), "self")
                for g in gen
            ]
        job.stage("candidates", len(train_q) + len(selfq) + len(val_q))
        out = {"train": [], "val": []}
        for dest, rows in (("train", train_q + selfq), ("val", val_q)):
            for text, asked, answers, source in rows:
                cands = _candidates(session, first_stage, snapshot, text, asked, answers, cfg.depth)
                out[dest].append({"query": text, "asked": str(asked), "source": source, "cands": cands})
                job.advance()
    out["counts"] = {
        "gold": len(train_q),
        "self": len(selfq),
        "val": len(val_q),
        "train_with_positive": sum(any(c["hit"] for c in i["cands"]) for i in out["train"]),
        "val_with_positive": sum(any(c["hit"] for c in i["cands"]) for i in out["val"]),
    }
    return out


def gathered_items(ctx: JobContext, job: JobHandle, *, until: dt.date, data: RerankerDataConfig) -> tuple[dict, Path]:
    """(`build_items`' result, the work folder that caches it): a rerun over the same index and first
    stage reuses the candidates; a new ingest or another retriever finds other ones. The caller
    deletes the folder once the candidates are used."""
    encoder, snapshot = serving_snapshot(ctx, lexical=ctx.retriever != "dense")
    work = (
        ctx.work_dir
        / "train-reranker"
        / f"data-{until}-{digest(data)}-{retrieval_key(ctx, encoder, snapshot, rerank=False)}"
    )
    swept = sweep_stale_candidates(work.parent, snapshot.snapshot_id)
    if swept:
        log.info("deleted %d re-ranker candidate folder(s) of an older index snapshot", swept)
    work.mkdir(parents=True, exist_ok=True)
    write_atomic(work / SNAPSHOT_STAMP, snapshot.snapshot_id.encode())
    cached = work / "items.json"
    if cached.exists():
        return json.loads(cached.read_text()), work
    items = build_items(ctx, job, until=until, cfg=data, encoder=encoder, snapshot=snapshot)
    write_atomic(cached, json.dumps(items).encode())  # a crash leaves no half-written cache
    return items, work


def run_export_reranker_job(
    ctx: JobContext,
    job: JobHandle,
    *,
    until: dt.date,
    dest: Path,
    data: RerankerDataConfig | None = None,
    negatives: int = 15,
) -> dict:
    """`sqa train reranker --until D --export DIR`: the candidates `run_train_reranker_job` would
    train and validate a cross-encoder on (gathered and cached the same way), written to `dest` for
    `python -m models.train_exported_reranker` on another machine (a GPU); `sqa rerankers import`
    brings the version back. A training question keeps its first `data.max_positives` candidates
    with the answer and up to `negatives` without; a held-back one keeps all its candidates (its
    recall is measured over them). Returns the job file's content."""
    data = data or RerankerDataConfig()
    items, work = gathered_items(ctx, job, until=until, data=data)
    job.update(message=f"writing the export to {dest}")
    info = {
        "kind": "cross-encoder",
        "trained_until": str(until),
        "held_back": month_key(month_start(until - dt.timedelta(days=1))),
        "depth": data.depth,
        "data_config": asdict(data),
        "export_negatives": negatives,
        "data": items["counts"],
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    info = write_export(dest, items, info, max_positives=data.max_positives, negatives=negatives, seed=data.seed)
    shutil.rmtree(work, ignore_errors=True)
    job.update(counts={**items["counts"], "passages": info["passages"], "exported_to": str(dest)})
    log.info("exported %s to %s (%s)", items["counts"], dest, EXPORT_FILE)
    return info


KINDS = ("cross-encoder", "features")


def run_train_reranker_job(
    ctx: JobContext,
    job: JobHandle,
    *,
    until: dt.date,
    max_minutes: float = 0.0,
    epochs: int = 1,
    data: RerankerDataConfig | None = None,
    activate: bool = False,
    kind: str = "cross-encoder",
) -> dict:
    """Train, validate, fit the recency prior, save the version; activate it when asked and it beats
    the first stage on the held-back month. Returns the version's info.

    `kind`: "cross-encoder" (MiniLM reads each pair, models/reranker.py) or "features" (a logistic
    model over cheap question/passage features, models/ltr.py: seconds to train, microseconds to serve)."""
    if kind not in KINDS:
        raise ValueError(f"re-ranker kind {kind!r} is unknown (use {' or '.join(KINDS)})")

    data = data or RerankerDataConfig()
    t0 = time.perf_counter()
    items, work = gathered_items(ctx, job, until=until, data=data)
    val = items["val"]
    t1 = time.perf_counter()
    if kind == "features":
        model, counts, result, scores = _train_features(job, items, val)
        extra = {"base": None}
    else:
        model, counts, result, scores = _train_cross_encoder(ctx, job, items, val, data, epochs, max_minutes, work)
        extra = {"base": "all-MiniLM-L6-v2"}
    t2 = time.perf_counter()
    first_stage = ranking_figures(val, None)
    # the recency prior and the first stage's own score join a cross-encoder's: fitted on the held-back
    # month, the combination is never blind to what the first stage knew. A feature model has both
    # among its features already; weights fitted on top of it gained on the held-back month and lost
    # on the next quarter (README, "Re-ranking"), so it serves alone.
    grid = [(0.0, 0.0)] if kind == "features" else [(w, f) for w in RECENCY_GRID for f in FIRST_STAGE_GRID]
    weight, first_weight, by_weight = fit_weights(val, scores, grid)
    figures = by_weight[(weight, first_weight)]
    version = f"reranker-{until}-{secrets.token_hex(3)}"
    info = {
        "version": version,
        "kind": kind,
        **extra,
        "trained_until": str(until),
        "held_back": month_key(month_start(until - dt.timedelta(days=1))),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "recency_weight": weight,
        "first_stage_weight": first_weight,
        "validation": figures,
        "first_stage": first_stage,
        "model_alone": by_weight[(0.0, 0.0)],
        "data": {**items["counts"], **counts},
        "depth": data.depth,
        "train": result,
        "seconds": {"data": round(t1 - t0, 1), "train_and_validate": round(t2 - t1, 1)},
    }
    # what the fitted weights reach without the model, and so whether the rule would serve it: kept in
    # the version's file too, so that a version trained without --activate says what the rule decided
    info["prior_alone"] = prior_alone(val, weight, first_weight)
    info["worth_serving"] = worth_serving(figures, first_stage, info["prior_alone"])
    model.info = info
    dest = ctx.rerankers_dir / version
    tmp = ctx.rerankers_dir / f".{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save(tmp, info)
    tmp.rename(dest)
    info["activated"] = bool(activate and info["worth_serving"])
    if info["activated"]:
        activate_reranker(ctx.rerankers_dir, version)
    job.update(
        counts={
            "version": version,
            "kind": kind,
            "activated": info["activated"],
            "validation": figures,
            "first_stage": first_stage,
            "recency_weight": weight,
            "first_stage_weight": first_weight,
        }
    )
    shutil.rmtree(work, ignore_errors=True)
    return info


# Written beside a candidate cache: the index snapshot it was gathered over. A cache of another
# snapshot is never read again (its key names that snapshot), so the next run deletes it.
SNAPSHOT_STAMP = "snapshot.id"


def sweep_stale_candidates(folder: Path, snapshot_id: str) -> int:
    """Delete the candidate caches under `folder` gathered over a snapshot other than `snapshot_id`
    (left by a run killed before a new ingest: no run reads them again). Those of this snapshot,
    under another first stage or data config, stay for a rerun of that command, and so does a folder
    without a stamp (from before stamps). Call it holding RERANKER_TRAINING_LOCK: no other run is
    gathering into them then. Returns how many were deleted."""
    if not folder.is_dir():
        return 0
    swept = 0
    for work in folder.glob("data-*"):
        stamp = work / SNAPSHOT_STAMP
        if stamp.exists() and stamp.read_text().strip() != snapshot_id:
            shutil.rmtree(work, ignore_errors=True)
            swept += 1
    return swept


def _train_features(job: JobHandle, items: dict, val: list[dict]):
    """(model, counts, result, validation scores) of a feature re-ranker fitted on the training items."""
    job.stage("fit", 1)
    t0 = time.perf_counter()
    usable = learnable(items["train"])
    if not usable:
        raise ValueError(
            f"no training questions: none of the {len(items['train'])} questions before the held-back "
            "month has both a candidate with its answer and one without"
        )
    model = FeatureReranker.fit(usable)
    job.advance()
    scores = _validation_scores(job, val, lambda i: model.score_candidates(i["query"], i["cands"]))
    result = {
        "questions": len(usable),
        "candidates": sum(len(i["cands"]) for i in usable),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    return model, {"questions_used": len(usable)}, result, scores


def _train_cross_encoder(
    ctx: JobContext,
    job: JobHandle,
    items: dict,
    val: list[dict],
    data: RerankerDataConfig,
    epochs: int,
    max_minutes: float,
    work: Path,
):
    """(model, counts, result, validation scores) of a MiniLM cross-encoder trained on groups,
    checkpointed in the `work` folder beside the candidates: the same command run again after a kill
    resumes the training where its last checkpoint left it (keyed by the training's settings but its
    budget, which counts the time already spent)."""
    groups = groups_of(items["train"], max_positives=data.max_positives, negatives=data.negatives, seed=data.seed)
    if not groups:
        raise ValueError(
            f"no training groups: none of the {len(items['train'])} questions before the held-back "
            "month has an answer among its candidates"
        )
    job.update(counts={"data": {**items["counts"], "groups": len(groups)}})
    device = ctx.torch_device()
    cfg = RerankerConfig(
        epochs=epochs,
        max_minutes=max_minutes,
        negatives=data.negatives,
        seed=data.seed,
        precision=resolve_precision("auto", device),  # bfloat16 where the device computes it natively
    )
    model = CrossEncoderReranker.from_packaged(cfg, device=device)
    checkpoint = work / f"ckpt-{digest(replace(cfg, max_minutes=0.0))}.pt"
    result = model.train_groups(groups, progress=fraction_reporter(job, log), checkpoint=checkpoint)
    scores = _validation_scores(job, val, lambda i: model.scores(i["query"], [c["input"] for c in i["cands"]]))
    return model, {"groups": len(groups)}, result, scores


def _validation_scores(job: JobHandle, val: list[dict], score) -> list[list[float]]:
    """`score(item)` of every held-back item, as lists, with progress."""
    job.stage("validate", len(val))
    out = []
    for item in val:
        out.append(list(map(float, score(item))))
        job.advance()
    return out
