"""Training that follows ingestion: the best reader becomes the default with no manual step.

After `sqa ingest` (and the scheduled monthly ingest) indexed months up to M, `after_ingest` first
trains a re-ranker (workers/train_reranker.py; activated only if it beats the first stage's recall@5
on the held-back month) unless the serving one already learnt everything before M, then trains the
reader on what is stored and dated before M, then checks it on a held-back month against the reader
serving now, and activates it only if it answers better there:

- no trained reader is active (a fresh store serves zero-shot Gemma): a Gemma version is trained from
  the base model on the gold questions before the held-back month, the self-labeled questions of the
  news before M, and validated on the held-back month (`workers.train.run_train_job`), with the next
  seeds too while the budget has room, and the soup of the runs is the new version (`train_seeds`);
- a Gemma version is active and was trained on data before the held-back month: it is fine-tuned on
  the held-back month's news with replay of older questions (`workers.train.run_finetune_job`);
- otherwise (already trained through it, or another kind chosen by hand): nothing runs, and the
  report says why.

The held-back month is the month before M. Nothing dated M or later is read, so an evaluation of M
and the months after it stays honest. The check is the served pipeline (retriever, passages,
reader) end to end on the held-back month's gold questions, or, in a store of news only, on questions
self-labeled from its articles; both readers answer the same questions. A training run is a job of
its own ("auto-train", resumable: the same command resumes it), with progress.
"""

from __future__ import annotations

import datetime as dt
import logging
import random
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from evaluation.metrics import exact_match, token_f1
from indexer.dates import month_key, month_start
from serving.errors import ConflictError
from serving.reader_registry import (
    READER_TRAINING_LOCK,
    activate_version,
    active_version,
    find_soup,
    get_version,
    soup_versions,
    version_dir,
)
from serving.reranking import active_reranker, list_reranker_versions
from workers.config import AutoTrainConfig

if TYPE_CHECKING:
    from workers.job_context import JobContext
    from workers.runner import JobHandle

log = logging.getLogger(__name__)

AUTO_TRAIN = "auto-train"


@dataclass(frozen=True)
class Check:
    n: int
    em: float
    f1: float

    def to_json(self) -> dict:
        return {"n": self.n, "em": round(100 * self.em, 1), "f1": round(100 * self.f1, 1)}


def held_back_period(until: dt.date, days: int = 0) -> tuple[dt.date, str]:
    """The period a training with the cut `until` is checked on: (its first day, its label), the
    period ending the day before `until`. `days` 0: the calendar month before the cut ("2024-02");
    N: the N days before it ("2024-02-23..2024-02-29"), the weekly adaptation's held-back week.

    Example:
        >>> held_back_period(dt.date(2024, 3, 1))
        (datetime.date(2024, 2, 1), '2024-02')
        >>> held_back_period(dt.date(2024, 3, 1), 7)
        (datetime.date(2024, 2, 23), '2024-02-23..2024-02-29')
    """
    if days < 0:
        raise ValueError(f"held-back days must be 0 (the month before) or positive, got {days}")
    if days == 0:
        first = month_start(until - dt.timedelta(days=1))
        return first, month_key(first)
    first = until - dt.timedelta(days=days)
    return first, f"{first}..{until - dt.timedelta(days=1)}"


def held_back_questions(
    ctx: JobContext, first: dt.date, before: dt.date, cfg: AutoTrainConfig
) -> tuple[list[tuple[str, dt.date, tuple[str, ...]]], str]:
    """(text, asked, answers) of the held-back month [first, before): its gold questions, else
    questions self-labeled from its articles (dated a few days after the article, as asked)."""
    from workers.reader_data import DataConfig, asked_after, gold_questions, self_labeled  # noqa: PLC0415 (lazy: workers.reader_data imports torch)

    rng = random.Random(cfg.seed)
    with ctx.sessions() as session:
        golds, _ = gold_questions(session, first, before)
        if golds:
            rows = [(q.text, q.asked, tuple(q.answers)) for q in golds]
            source = "gold"
        else:
            gen = self_labeled(
                session,
                first,
                before,
                DataConfig(seed=cfg.seed + 7),
                max_articles=cfg.check_questions * 2,
                per_article=1,
            )
            rows = [
                (g.question, asked_after(g.published, rng, before - dt.timedelta(days=1)), (g.answer,)) for g in gen
            ]
            source = "self-labeled"
    rng.shuffle(rows)
    return rows[: cfg.check_questions], source


def check_reader(ctx: JobContext, reader, questions, progress=None) -> Check:
    """EM/F1 of the served pipeline with `reader` on the questions, each asked as of its date."""
    service = ctx.load_answer_service(reader)
    service.index_state.refresh()  # a fresh state: open the serving snapshot
    ems, f1s = [], []
    for text, asked, answers in questions:
        answer = service.answer(text, asked).answer
        ems.append(exact_match(answer, answers))
        f1s.append(token_f1(answer, answers))
        if progress is not None:
            progress.advance()
    n = len(questions)
    return Check(n, sum(ems) / n if n else 0.0, sum(f1s) / n if n else 0.0)


def plan(ctx: JobContext, until: dt.date, held_back_days: int = 0) -> dict:
    """What `after_ingest` would do for a cut at `until`: {"action": "train" | "finetune" | "skip", ...}
    (`held_back_days`: `held_back_period`'s)."""
    _, held_back = held_back_period(until, held_back_days)
    if ctx.reader != "auto":
        return {
            "action": "skip",
            "reason": f"SQA_READER={ctx.reader} pins the reader: ingestion trains only "
            "when the active version serves (SQA_READER=auto)",
        }
    with ctx.sessions() as session:
        active = active_version(session)
        if active is None:
            return {"action": "train", "held_back": held_back}
        if active.kind != "gemma":
            return {
                "action": "skip",
                "reason": f"the active reader {active.version} is a {active.kind} chosen by "
                "hand; activate a gemma version or none to let ingestion train",
            }
        # trained_until: a training's cut, or a fine-tune's last day: either way it knows the news
        # before `until` once it reaches the day before it
        if active.trained_until is not None and active.trained_until >= until - dt.timedelta(days=1):
            return {
                "action": "skip",
                "reason": f"the active reader {active.version} is trained through "
                f"{active.trained_until}: nothing new before {until}",
            }
        return {"action": "finetune", "parent": active.version, "held_back": held_back}


def reranker_plan(ctx: JobContext, until: dt.date) -> dict:
    """Train a re-ranker unless the serving one already learnt what is dated before `until`."""
    active = active_reranker(ctx.rerankers_dir)
    if active is not None:
        info = next((i for i in list_reranker_versions(ctx.rerankers_dir) if i["version"] == active), {})
        if str(info.get("trained_until", "")) >= str(until):
            return {
                "action": "skip",
                "reason": f"the serving re-ranker {active} is trained until {info['trained_until']}",
            }
    return {"action": "train"}


def _train_reranker(ctx: JobContext, job: JobHandle, until: dt.date, cfg: AutoTrainConfig) -> dict:
    """The re-ranker first (the reader then learns from the passages it puts on top); a failure is
    reported, and the reader is still trained."""
    from workers.train_reranker import RERANKER_TRAINING_LOCK, RerankerDataConfig, run_train_reranker_job  # noqa: PLC0415 (lazy: workers.train_reranker imports torch)

    what = reranker_plan(ctx, until)
    if what["action"] == "skip":
        return what
    job.update(message=f"training a re-ranker on what is dated before {until}")
    try:  # under the lock `sqa train reranker` holds: one re-ranker training at a time, whoever runs it
        with ctx.runner.lock(RERANKER_TRAINING_LOCK).hold():
            info = run_train_reranker_job(
                ctx,
                job,
                until=until,
                max_minutes=cfg.reranker_minutes,
                activate=True,
                kind=cfg.reranker_kind,
                data=RerankerDataConfig(depth=cfg.reranker_depth),
            )
    except (ValueError, ConflictError) as exc:  # no data to learn from, or one runs already: say so, go on
        log.warning("no re-ranker trained: %s", exc)
        return {"action": "skip", "reason": str(exc)}
    return {
        "action": "train",
        "version": info["version"],
        "kind": info["kind"],
        "activated": info["activated"],
        "validation": info["validation"],
        "first_stage": info["first_stage"],
        "recency_weight": info["recency_weight"],
    }


def train_seeds(
    ctx: JobContext, job: JobHandle, *, until: dt.date, spec, seeds: int, clock=time.monotonic
) -> tuple[str, list[str]]:
    """A first training: `spec` run with seed, seed + 1, ... (up to `seeds` runs, each a version of
    its own, not activated), and their soup registered as one more version
    (docs/reader-experiments.md, "Two seeds and their soup are the default": on two stores, four
    soups of two runs each scored 0.6 to 1.9 EM above their runs' mean). Returns (the version to
    check, the runs).

    Another run starts only while the budget (`spec.max_minutes`) has room for one more as long as
    the runs so far took on average, so a tight budget trains one run, as before. The budget is each
    run's cap too (it is in the spec, so an interrupted run resumes from its checkpoints: its work
    folder's key); a first training stops at its first validation well within it.

    Resumable run by run: a run a stopped job already saved over the passages served now
    (`workers.train.saved_run`) is taken as it is, its training minutes counted against the budget,
    and an existing soup of the same runs is not registered again."""
    from workers.train import current_retrieval_key, run_train_job, saved_run  # noqa: PLC0415 (lazy: workers.train imports torch)

    key = current_retrieval_key(ctx)
    t0, members, earlier = clock(), [], 0.0  # earlier: minutes of the runs a stopped job saved
    for k in range(max(1, seeds)):
        run = replace(spec, seed=spec.seed + k)
        if (saved := saved_run(ctx, until=until, spec=run, key=key)) is not None:
            version, info = saved
            earlier += float(info.get("train_seconds") or 0.0) / 60
            log.info("auto-train: run %d (seed %d) was saved by a stopped job: %s", k + 1, run.seed, version)
            job.update(message=f"run {k + 1} (seed {run.seed}) is {version}, saved by a stopped job")
            members.append(version)
            continue
        spent = (clock() - t0) / 60 + earlier
        if members and spec.max_minutes and spec.max_minutes - spent < spent / len(members):
            log.info(
                "auto-train: %d run(s) in %.1f of %.0f minutes: no room for another",
                len(members),
                spent,
                spec.max_minutes,
            )
            break
        if k:
            job.update(message=f"training run {k + 1} of up to {seeds} (seed {run.seed}) for a soup of seeds")
        members.append(run_train_job(ctx, job, until=until, spec=run, activate=False))
    if len(members) == 1:
        return members[0], members
    job.update(message=f"averaging {', '.join(members)} into one version (a soup of seeds)")
    with ctx.sessions() as session, session.begin():
        soup = find_soup(session, members, models_dir=ctx.models_dir)  # made by a stopped job
        if soup is None:
            soup = soup_versions(session, members, models_dir=ctx.models_dir, check=ctx.load_reader_folder).version
    return soup, members


def after_ingest(ctx: JobContext, job: JobHandle, *, until: dt.date, cfg: AutoTrainConfig) -> dict:
    """Train on what is dated before `until` (the first ingested month's start, or the last one's),
    check on the month before it, activate if better. Returns what happened (the job's counts)."""
    from workers.reader_spec import ReaderJobSpec  # noqa: PLC0415 (lazy: workers.reader_spec imports torch)
    from workers.train import run_finetune_job  # noqa: PLC0415 (lazy: workers.train imports torch)

    reranker = _train_reranker(ctx, job, until, cfg) if cfg.rerank else None
    what = plan(ctx, until, cfg.held_back_days)
    if reranker is not None:
        what = {**what, "reranker": reranker}
    if what["action"] == "skip":
        job.update(message=what["reason"])
        return what
    held_from, held_back = held_back_period(until, cfg.held_back_days)
    questions, source = held_back_questions(ctx, held_from, until, cfg)
    if not questions:
        what = {
            "action": "skip",
            "reason": f"nothing to check a new reader on: no question and no article in "
            f"the held-back period {held_back}",
        }
        job.update(message=what["reason"])
        return what

    # No validation before the first step: the check below scores the serving reader on the held-back
    # month anyway, and scoring the untrained base first took 4 to 8 of a 10-minute budget's minutes.
    spec = ReaderJobSpec.for_gemma(
        max_minutes=cfg.max_minutes, seed=cfg.seed, validate_first=False, context_words=cfg.context_words
    )
    if what["action"] == "train":
        version, members = train_seeds(ctx, job, until=until, spec=spec, seeds=cfg.seeds)
        if len(members) > 1:
            what = {**what, "soup_of": members}
    else:
        parent_spec = spec.for_finetune()
        version = run_finetune_job(
            ctx,
            job,
            month=month_key(held_from),
            period=None if cfg.held_back_days == 0 else (held_from, until),
            spec=parent_spec,
            activate=False,
            max_minutes=cfg.max_minutes,
        )
    job.update(
        message=f"checking {version} against the serving reader on {len(questions)} {source} questions of {held_back}"
    )
    with ctx.sessions() as session:
        folder = version_dir(get_version(session, version), ctx.models_dir)
    job.stage("check", 2 * len(questions))
    incumbent = check_reader(ctx, None, questions, job)
    candidate = check_reader(ctx, ctx.load_reader_folder(folder), questions, job)
    better = (candidate.f1, candidate.em) > (incumbent.f1, incumbent.em)
    if better:
        with ctx.sessions() as session, session.begin():
            activate_version(session, version, models_dir=ctx.models_dir)
    verdict = "activated" if better else "kept the serving reader"
    log.info(
        "auto-train %s: %s (held-back %s, %s questions: new F1 %.1f vs %.1f)",
        version,
        verdict,
        held_back,
        source,
        100 * candidate.f1,
        100 * incumbent.f1,
    )
    return {
        **what,
        "version": version,
        "activated": better,
        "check": {
            "month": held_back,
            "questions": source,
            "new": candidate.to_json(),
            "serving": incumbent.to_json(),
        },
    }


def describe(done: dict) -> str:
    """One line for a job's message and the CLI: what `after_ingest` did."""
    r = done.get("reranker")
    if r is None:
        head = ""
    elif r["action"] == "skip":
        head = f"re-ranker skipped ({r['reason']}); "
    else:
        v, f = r["validation"], r["first_stage"]  # better recall@5 wins; at equal recall@5, the better MRR
        head = (
            f"re-ranker {r['version']} {'activated' if r['activated'] else 'not activated'} (held-back recall@5 "
            f"{v['recall@5']}, MRR {v['mrr']} vs first stage {f['recall@5']}, MRR {f['mrr']}); "
        )
    if done.get("action") == "skip":
        return f"{head}reader skipped: {done['reason']}"
    c = done["check"]
    soup = f" (the soup of {len(done['soup_of'])} runs: {', '.join(done['soup_of'])})" if done.get("soup_of") else ""
    return (
        f"{head}reader {done['version']}{soup} {'activated' if done['activated'] else 'not activated'}: on "
        f"{c['new']['n']} {c['questions']} questions of {c['month']} it scores EM {c['new']['em']} F1 "
        f"{c['new']['f1']}, the serving reader EM {c['serving']['em']} F1 {c['serving']['f1']}"
    )


def nothing_to_do(ctx: JobContext, until: dt.date, cfg: AutoTrainConfig) -> str | None:
    """Why `after_ingest` would do nothing at this cut (no job is worth recording), or None."""
    reader = plan(ctx, until, cfg.held_back_days)
    if reader["action"] != "skip":
        return None
    if not cfg.rerank:
        return reader["reason"]
    reranker = reranker_plan(ctx, until)
    return None if reranker["action"] != "skip" else f"{reader['reason']}; {reranker['reason']}"


def run_after_ingest(ctx: JobContext, until: dt.date, cfg: AutoTrainConfig, *, keep_going: bool = False) -> dict:
    """`after_ingest` as an "auto-train" job under the reader-training lock, or a skip (no job row)
    when there is nothing to learn. Returns the job's result with its "job_id". A failure is on the
    job's row; it is raised again, or with `keep_going` returned as {"job_id", "error"}."""
    reason = nothing_to_do(ctx, until, cfg)
    if reason is not None:
        return {"action": "skip", "reason": reason}
    job_id = ctx.runner.create(AUTO_TRAIN, {"until": str(until)})
    try:
        done = ctx.runner.run(
            job_id,
            lambda job: after_ingest(ctx, job, until=until, cfg=cfg),
            lock=ctx.runner.lock(READER_TRAINING_LOCK),
            result_key="auto_train",
            message=describe,
        )
    except Exception as exc:
        if not keep_going:
            raise
        log.error("training after ingest (until %s) failed (job %d): %s", until, job_id, exc)
        return {"job_id": job_id, "error": str(exc)}
    return {"job_id": job_id, **done}
