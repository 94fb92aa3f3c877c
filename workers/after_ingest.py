"""What follows an ingest: the one decision the CLI (`sqa ingest`), the scheduler's monthly ingest and
the API (`POST /admin/ingest`) all take, in `train_after_ingest`.

1. SQA_AUTO_TRAIN: train on what is dated before the ingested month, check on the month before it,
   activate only if better (workers/auto_train.py; an "auto-train" job of its own, or a skip).
2. Then SQA_FINETUNE_POLICY: `never`; `always` fine-tunes the active reader on the ingested month;
   `on-drift` only when the predicted F1 drop of the month exceeds SQA_DRIFT_DROP_THRESHOLD
   (a "finetune" job of its own, which activates the new version).

Each step's failure is on its own job's row; the month stays ingested.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sqlalchemy.orm import Session

from indexer.dates import month_key
from serving.reader_registry import READER_TRAINING_LOCK, active_version
from store.tables import Job
from workers.auto_train import nothing_to_do, run_after_ingest
from workers.config import AutoTrainConfig
from workers.version_transport import month_scores, predicted_drop, profile_loader

if TYPE_CHECKING:
    from workers.job_context import JobContext

log = logging.getLogger(__name__)

AFTER_INGEST = "after_ingest"  # the key an API ingest job's counts keep the result under
NO_TRAIN = "training after ingest is off (--no-train)"
AUTO_TRAIN_OFF = "SQA_AUTO_TRAIN=false"
NO_ACTIVE_READER = "no trained reader is active: run `sqa train reader --until YYYY-MM-DD` first"
RANKER_REFIT = (
    "the active reader is a ranker, which is refitted rather than fine-tuned: run "
    "`sqa train reader --kind ranker --until YYYY-MM-DD --activate`"
)
NO_EVALUATION = (
    "the on-drift policy predicts from evaluated quarters, and {name} has none yet: run `sqa evaluate "
    "--quarter YYYYQn` with it serving"
)


def train_after_ingest(
    ctx: JobContext,
    month: dt.date,
    *,
    indexed: bool = True,
    train: bool = True,
    train_minutes: float | None = None,
    keep_going: bool = True,
    on_train: Callable[[dt.date, AutoTrainConfig], None] | None = None,
    record_on: int | None = None,
) -> dict:
    """Auto-train, then the fine-tune policy, after an ingest whose last month starts on `month`.

    Args:
        month: the first day of the (last) ingested month: auto-train learns what is dated before it,
            the fine-tune policy fine-tunes on it.
        indexed: False when that month had no articles to index: nothing trains, and each step says so.
        train: False (`sqa ingest --no-train`): nothing trains after this ingest.
        train_minutes: the auto-train budget instead of SQA_AUTO_TRAIN_MINUTES.
        keep_going: a failed training is returned as {"job_id", "error"} (else raised again).
        on_train: called just before an auto-train job starts (the CLI says that it takes a while).
        record_on: an ingest job already succeeded (the API's) whose counts keep the result under
            "after_ingest".
    Returns:
        {"auto_train": what auto-train did ({"action": "off" | "skip" | "train" | "finetune", ...}),
         "finetune": what the policy did ({"policy", "ran", ...})}.
    """
    cfg = ctx.auto_train if train_minutes is None else dataclasses.replace(ctx.auto_train, max_minutes=train_minutes)
    done = {
        "auto_train": _auto_train(
            ctx, month, cfg, indexed=indexed, train=train, keep_going=keep_going, on_train=on_train
        ),
        "finetune": _finetune(ctx, month_key(month), indexed=indexed, train=train, keep_going=keep_going),
    }
    if record_on is not None:
        record_after_ingest(ctx, record_on, done)
    return done


def record_after_ingest(ctx: JobContext, job_id: int, done: dict) -> None:
    """Keep what followed an ingest in its (succeeded) job's counts, under "after_ingest"."""
    with ctx.sessions() as session, session.begin():
        job = session.get(Job, job_id)
        if job is not None:
            job.counts = {**(job.counts or {}), AFTER_INGEST: done}


def _auto_train(
    ctx: JobContext,
    until: dt.date,
    cfg: AutoTrainConfig,
    *,
    indexed: bool,
    train: bool,
    keep_going: bool,
    on_train: Callable[[dt.date, AutoTrainConfig], None] | None,
) -> dict:
    if not train or not cfg.enabled:
        return {"action": "off", "reason": NO_TRAIN if not train else AUTO_TRAIN_OFF}
    if not indexed:
        return {"action": "skip", "reason": f"no articles in {month_key(until)}"}
    if on_train is not None and nothing_to_do(ctx, until, cfg) is None:
        on_train(until, cfg)
    return run_after_ingest(ctx, until, cfg, keep_going=keep_going)


def _finetune(ctx: JobContext, month: str, *, indexed: bool, train: bool, keep_going: bool) -> dict:
    """SQA_FINETUNE_POLICY after `month` was ingested: `always` fine-tunes the active reader on the
    month (as its own job, which activates the new version); `on-drift` when `drift_decision` says so."""
    policy = ctx.finetune_policy
    if policy == "never":
        return {"policy": policy, "ran": False}
    if not train:
        return {"policy": policy, "ran": False, "reason": NO_TRAIN}
    if not indexed:
        return {"policy": policy, "ran": False, "reason": f"no articles in {month}"}
    with ctx.sessions() as session:
        active = active_version(session)
        if active is None:
            log.warning("SQA_FINETUNE_POLICY=%s: %s", policy, NO_ACTIVE_READER)
            return {"policy": policy, "ran": False, "reason": NO_ACTIVE_READER}
        if active.kind == "ranker":  # refitted on gold questions, never fine-tuned on a month
            log.info("SQA_FINETUNE_POLICY=%s: %s", policy, RANKER_REFIT)
            return {"policy": policy, "ran": False, "reason": RANKER_REFIT}
        decision = drift_decision(ctx, session, active, month) if policy == "on-drift" else {}
    if policy == "on-drift" and not decision.get("finetune"):
        log.info("SQA_FINETUNE_POLICY=on-drift: not fine-tuning on %s: %s", month, decision.get("reason"))
        return {"policy": policy, "ran": False, **decision}
    from workers.train import run_finetune_job  # noqa: PLC0415 (lazy: torch)

    job_id = ctx.runner.create("finetune", {"month": month})
    try:
        version = ctx.runner.run(
            job_id,
            lambda handle: run_finetune_job(ctx, handle, month=month),
            lock=ctx.runner.lock(READER_TRAINING_LOCK),
            message=lambda v: f"version {v}",
        )
    except Exception as exc:  # the month stays ingested; the failure is on the finetune job's row
        if not keep_going:
            raise
        log.error("fine-tuning on %s failed (job %d): %s", month, job_id, exc)
        return {"policy": policy, "ran": True, "job_id": job_id, "error": str(exc)}
    return {"policy": policy, "ran": True, "job_id": job_id, "version": version, **decision}


def drift_decision(ctx: JobContext, session: Session, active, month: str) -> dict:
    """on-drift: fine-tune when the predicted F1 drop of the new month exceeds SQA_DRIFT_DROP_THRESHOLD.

    The regression is fitted on the active version's own evaluated months (workers/version_transport.py);
    a version never evaluated has nothing to predict from, so it is not fine-tuned (say so).
    """
    name = f"{active.kind}:{active.version}"
    scores = {v: sc for v, sc in month_scores(session).items() if v.split(" @ ")[0] == name}
    if not scores:
        return {"finetune": False, "reason": NO_EVALUATION.format(name=name)}
    version = max(scores, key=lambda v: sum(m.n for m in scores[v].values()))  # the most evaluated encoder
    try:
        p = predicted_drop(scores[version], profile_loader(session, ctx.transport), month, measure=ctx.drift_measure)
    except ValueError as exc:
        return {"finetune": False, "reason": f"no drift prediction: {exc}"}
    threshold = ctx.drift_drop_threshold
    verdict = "exceeds" if p["predicted_drop"] > threshold else "is within"
    return {
        "finetune": p["predicted_drop"] > threshold,
        "prediction": p,
        "reason": f"predicted F1 drop {p['predicted_drop']:.2f} {verdict} the threshold {threshold:.2f} "
        f"({ctx.drift_measure} drift {p['drift']:.4f} from {p['source']})",
    }
