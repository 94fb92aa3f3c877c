"""Reader training jobs: `sqa train reader --until D` and the monthly `sqa finetune --month M`.

Training data are gold questions dated before the cut plus self-labeled questions generated from
articles published before it, each with the passages the serving index retrieves as of the
question's date (the passage holding the answer is put in when retrieval missed it). Validation is
on the gold questions of the last month before the cut, never on anything after it. A job's work
folder (data, checkpoints) is keyed by its parameters, so running the same command again resumes;
the finished model becomes a registered version folder under `models_dir`. What a job trains, its
`ReaderJobSpec`, is workers/reader_spec.py's.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import TYPE_CHECKING

from indexer.atomic import write_atomic
from indexer.dates import month_key, month_start, next_month, parse_month
from models.extractive import SpanConfig, SpanModel
from models.fid import FiDConfig, FiDModel
from models.gemma_prompt import build_prompt
from models.gemma_train import GemmaModel
from models.gemma_weights import gemma_folder, onednn_bfloat16
from models.train_exported import JOB_FILE, save_tokenizer
from models.trained import load_trained_model, read_reader_info, write_reader_info
from models.training import ReaderTrainer, load_examples, save_examples
from serving.reader_registry import active_version, check_servable, new_version_name, ready_infos, register_version
from workers.bakeoff_gold import gold_passage
from workers.progress import fraction_reporter
from workers.reader_data import (
    DataConfig,
    _Builder,
    build_datasets,
    digest,
    gold_questions,
    indexed_start,
    retrieval_key,
    serving_snapshot,
)
from workers.reader_spec import ReaderJobSpec
from workers.runner import JobHandle
from workers.train_ranker import run_ranker_job

if TYPE_CHECKING:
    from workers.job_context import JobContext

log = logging.getLogger(__name__)


# ---- jobs ---------------------------------------------------------------------------------------


def _new_model(spec: ReaderJobSpec, models_dir: Path | None = None):
    """An untrained model of the spec's kind; Gemma's base is converted into `models_dir/base` (where
    the serving fallback keeps it too, and where its versions look for it)."""
    if spec.kind == "gemma":
        return GemmaModel.from_base(
            spec.gemma_config(), cache_dir=models_dir / "base" if models_dir is not None else None
        )
    if spec.kind == "fid":
        return FiDModel.warm_start(
            FiDConfig(
                backbone=spec.backbone,
                base=spec.base,
                n_passages=spec.infer_passages,
                max_passage_tokens=spec.max_passage_tokens,
            )
        )
    if spec.kind == "extractive":
        return SpanModel.warm_start(
            SpanConfig(n_passages=spec.infer_passages, max_passage_tokens=spec.max_passage_tokens)
        )
    raise ValueError(f"reader kind {spec.kind!r} is unknown (use fid, extractive, gemma or ranker)")


# Written in a training's work folder once its examples are saved: the retrieval they were gathered
# with (`retrieval_key`). Work under another key, or none, is stale.
RETRIEVAL_STAMP = "retrieval.key"


def _training_data(ctx: JobContext, job: JobHandle, work: Path, make_data) -> tuple[list, list, dict]:
    """(train, val, counts): built with the served retriever (hybrid by default, re-ranked: the reader
    learns from the passages it will be given) and saved in `work` first; reused from `work` when an
    interrupted run over the same index and served retriever left them there. An interrupted run's
    work under another index snapshot, retriever, re-ranker or encoder (a new ingest came between) is
    deleted, checkpoints included: its examples hold passages a run would not retrieve now, so the
    training starts over on new ones."""
    encoder, snapshot, key = _served_retrieval(ctx)
    stamp = work / RETRIEVAL_STAMP
    previous = None
    if work.exists() and any(work.iterdir()) and (not stamp.exists() or stamp.read_text().strip() != key):
        previous = (
            "discarded: its examples were retrieved over another index, retriever, re-ranker or encoder; "
            "the training starts over"
        )
        log.warning("%s: the interrupted run's work is %s", work.name, previous)
        job.update(message=f"an interrupted run's work was {previous}")
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    if stamp.exists():
        train, val = load_examples(work / "train.jsonl"), load_examples(work / "val.jsonl")
        counts = {"train": len(train), "val": len(val), "data": "reused from an interrupted run"}
    else:
        with ctx.db.sessions() as session:
            train, val, dc = make_data(session, ctx.make_retriever(encoder), snapshot, job)
        save_examples(work / "val.jsonl", val)
        save_examples(work / "train.jsonl", train)
        write_atomic(stamp, key.encode())  # last: examples without it are stale (a crash while saving them)
        counts = {"train": len(train), "val": len(val), **asdict(dc)}
        if previous:
            counts["previous_run"] = previous
    counts["retrieval"] = key  # what the examples were retrieved over (a saved version's: `saved_run`)
    log.info("training data: %s", counts)
    job.update(counts=counts)
    if not train:
        raise ValueError("no training examples: are the months before the cut ingested?")
    return train, val, counts


def slow_bfloat16(device: str) -> str | None:
    """What to tell a user who trains in bfloat16 (SQA_TRAIN_PRECISION=bfloat16) on a CPU that
    oneDNN has no bfloat16 kernels for (no AVX-512), where each step falls back to loops; None elsewhere."""
    if device.startswith("cuda") or onednn_bfloat16(device):
        return None
    return (
        "training in bfloat16 on a CPU without AVX-512: oneDNN has no bfloat16 kernel for it, so each step "
        "falls back to loops, many times slower than float32 (SQA_TRAIN_PRECISION=auto or float32 trains in "
        "float32 here)"
    )


def _train_and_register(
    ctx: JobContext,
    job: JobHandle,
    *,
    spec: ReaderJobSpec,
    label: str,
    work: Path,
    make_data,
    model_factory,
    until: dt.date,
    month: str | None = None,
    parent: str | None = None,
    activate: bool | None = None,
) -> str:
    """Shared by training and fine-tuning: data (cached in `work`), the loop, the version folder.
    Run it under the reader-training lock (`READER_TRAINING_LOCK`): one reader training per SQA_HOME."""
    db, progress = ctx.db, job
    t0 = time.perf_counter()
    train, val, counts = _training_data(ctx, job, work, make_data)
    model = model_factory()
    if hasattr(model, "use_precision"):  # Gemma: SQA_TRAIN_PRECISION, whatever a parent version trained in
        model.use_precision(ctx.train_precision)
    trainer = ReaderTrainer(model, spec.kind, spec.train_config(), work / "run")
    precision = getattr(model, "training_precision", None)  # Gemma: "bfloat16" (autocast) or "float32"
    if precision:
        log.info("training a %s reader in %s", spec.kind, precision)
        if precision == "bfloat16" and (warning := slow_bfloat16(str(model.device))):
            log.warning(warning)
    t1 = time.perf_counter()
    report = fraction_reporter(progress, log)

    result = trainer.train(train, val, report)
    version = new_version_name(spec.kind, label)
    dest = ctx.models_dir / version
    shutil.copytree(trainer.best_dir, dest)
    info = {
        "kind": spec.kind,
        "version": version,
        "parent_version": parent,
        "trained_until": until.isoformat(),
        "month": month,
        "spec": asdict(spec),
        "data": counts,
        "validation": result.best,
        **({"validation_top": result.top} if result.top else {}),
        "history": result.history,
        "stopped": result.stopped,
        "steps": result.steps,
        "train_seconds": result.seconds,
        **({"precision": precision} if precision else {}),
    }
    write_reader_info(dest, info)
    del trainer, model  # freed (peft's modules hold cycles: collected) before the export loads the version
    gc.collect()
    t2 = time.perf_counter()
    ctx.export_reader_folder(dest)  # llama.cpp's GGUF where serving reads the version there; a failure is logged
    t3 = time.perf_counter()
    with db.sessions() as session, session.begin():
        make_active = bool(activate)  # a new version serves only once someone activates it
        register_version(
            session,
            version=version,
            kind=spec.kind,
            path=version,
            parent_version=parent,
            trained_until=until,
            month=month,
            job_id=job.job_id,
            activate=make_active,
            models_dir=ctx.models_dir,
            metrics={
                "validation": result.best,
                "steps": result.steps,
                "stopped": result.stopped,
                "train": counts.get("train"),
                "val": counts.get("val"),
            },
        )
        job.update_in(
            session,
            counts={"version": version, "activated": make_active, "validation": result.best},
            timings={"data_s": round(t1 - t0, 1), "train_s": round(t2 - t1, 1), "export_s": round(t3 - t2, 1)},
        )
    shutil.rmtree(work, ignore_errors=True)
    return version


def _served_retrieval(ctx: JobContext):
    """(encoder, serving snapshot, key of the passages a reader training retrieves over them now:
    `workers.reader_data.retrieval_key`)."""
    encoder, snapshot = serving_snapshot(ctx, lexical=ctx.retriever != "dense")
    return encoder, snapshot, retrieval_key(ctx, encoder, snapshot, rerank=True)


def current_retrieval_key(ctx: JobContext) -> str:
    """The key of the passages a reader training would retrieve now (what a version's data records)."""
    return _served_retrieval(ctx)[2]


def saved_run(ctx: JobContext, *, until: dt.date, spec: ReaderJobSpec, key: str) -> tuple[str, dict] | None:
    """A version `run_train_job(until=until, spec=spec)` already saved over the passages served now
    (`key`: `current_retrieval_key`): ready, not active, trained from the base (not a fine-tune, an
    import or a soup) with this very spec (seed and budget included) and examples retrieved under
    `key`. The newest such (version, reader.json), or None. A job that trains several runs (`sqa
    train auto`'s seeds) resumes with it rather than training it again."""
    want = asdict(spec)  # plain str, int, float and bool fields: equal to what reader.json reads back
    with ctx.sessions() as session:
        for row, info in ready_infos(session, ctx.models_dir, spec.kind):
            if (
                not row.active
                and row.parent_version is None
                and row.trained_until == until
                and info.get("spec") == want
                and (info.get("data") or {}).get("retrieval") == key
                and not info.get("soup_of")
                and not info.get("imported_from")
            ):
                return row.version, info
    return None


def _first_training_data(until: dt.date, data: DataConfig):
    """make_data for a first training: gold questions from the index's first day to the month before
    `until`, validated on that month, plus self-labeled questions of the articles before `until`."""
    val_from = month_start(until - dt.timedelta(days=1))

    def make_data(session, retriever, snapshot, progress):
        first = indexed_start(snapshot)
        if first >= val_from:
            raise ValueError(
                f"the index starts {first}: ingest months before {month_key(val_from)} to train "
                f"(validation uses {month_key(val_from)})"
            )
        return build_datasets(
            session, retriever, snapshot, train_from=first, until=until, val_from=val_from, cfg=data, progress=progress
        )

    return make_data


def run_train_job(
    ctx: JobContext,
    job: JobHandle,
    *,
    until: dt.date,
    spec: ReaderJobSpec | None = None,
    data: DataConfig | None = None,
    activate: bool | None = None,
) -> str:
    """`sqa train reader --until D`: a new version trained on what is dated before `until`.
    Run it under the reader-training lock (the CLI and the API do, through the job runner)."""
    spec = spec or ReaderJobSpec()
    data = spec.data_config(data)
    if spec.kind == "ranker":  # no network to train: a logistic regression (workers/train_ranker.py)
        return run_ranker_job(ctx, job, until=until, spec=spec, data=data, activate=activate)
    work = ctx.work_dir / "train" / f"{spec.kind}-{until}-{digest(spec, data)}"
    return _train_and_register(
        ctx,
        job,
        spec=spec,
        label=str(until),
        work=work,
        make_data=_first_training_data(until, data),
        model_factory=lambda: _new_model(spec, ctx.models_dir),
        until=until,
        activate=activate,
    )


def run_export_job(
    ctx: JobContext, job: JobHandle, *, until: dt.date, dest: Path, spec: ReaderJobSpec | None = None
) -> dict:
    """`sqa train reader --kind gemma --until D --export DIR`: the data `run_train_job` would train
    on (built the same way, resumable the same way), written to `dest` with the settings a training
    elsewhere needs (`models.train_exported`, e.g. on a GPU machine that has neither the store nor
    the index); `sqa models import` brings the trained version back. Returns the job file's content."""
    spec = spec or ReaderJobSpec.for_gemma()
    if spec.kind != "gemma":
        raise ValueError(
            f"--export trains elsewhere with models.train_exported, which trains gemma readers only (got {spec.kind})"
        )
    data = spec.data_config()
    # Its own work folder: a training's of the same spec holds checkpoints that must outlive an export.
    work = ctx.work_dir / "export" / f"{spec.kind}-{until}-{digest(spec, data)}"
    train, val, counts = _training_data(ctx, job, work, _first_training_data(until, data))
    dest.mkdir(parents=True, exist_ok=True)
    (dest / JOB_FILE).unlink(missing_ok=True)  # written last: without it the folder is no export
    for name in ("train.jsonl", "val.jsonl"):  # what _training_data saved: copied, not written again
        shutil.copy2(work / name, dest / name)
    # SQA_TRAIN_PRECISION travels with the data: `models.train_exported` trains in it unless told otherwise.
    model = replace(spec.gemma_config(), precision=ctx.train_precision)
    first = train[0]
    job.update(message="copying the tokenizer (converting the packaged Gemma on first use)")
    check = save_tokenizer(
        gemma_folder(ctx.models_dir / "base"),
        dest,
        build_prompt(first.question, first.as_of, first.passages, model.max_passage_words),
    )
    info = {
        "kind": spec.kind,
        "label": str(until),
        "trained_until": str(until),
        "spec": asdict(spec),
        "data": counts,
        "model": model.to_json(),
        "train": asdict(spec.train_config()),
        "tokenizer_check": check,
    }
    tmp = dest / (JOB_FILE + ".tmp")
    tmp.write_text(json.dumps(info, indent=2, default=str))
    tmp.replace(dest / JOB_FILE)
    shutil.rmtree(work, ignore_errors=True)
    job.update(counts={"train": len(train), "val": len(val), "exported_to": str(dest)})
    return info


def run_finetune_job(
    ctx: JobContext,
    job: JobHandle,
    *,
    month: str,
    spec: ReaderJobSpec | None = None,
    data: DataConfig | None = None,
    replay_ratio: float = 1.0,
    activate: bool = True,
    max_minutes: float = 0.0,
    period: tuple[dt.date, dt.date] | None = None,
) -> str:
    """`sqa finetune --month M`: continue from the active version on M's self-labeled questions
    plus a replay sample of older self-labeled and gold questions (so it does not forget);
    validated on the gold questions of the month before M. The new version becomes active.

    `period` (first day, day after the last): a shorter period than M instead (the weekly
    adaptation's week, within or across months): its news is learnt, the older news replayed, and
    the gold questions of as many days before it validate."""
    if period is None:
        first = parse_month(month)
        until = next_month(first)
        prev = month_start(first - dt.timedelta(days=1))
        label = month
    else:
        first, until = period
        if until <= first:
            raise ValueError(f"the fine-tune period {first}..{until} is empty")
        prev = first - (until - first)
        label = f"wk-{first}"
    with ctx.sessions() as session:
        row = active_version(session)
        if row is None:
            raise ValueError("no trained reader to fine-tune: run `sqa train reader --until YYYY-MM-DD` first")
        parent_dir = check_servable(row, ctx.models_dir)
        parent, kind = row.version, row.kind
    if kind == "ranker":
        raise ValueError(
            f"the active version {parent} is a ranker, which is refitted rather than fine-tuned: "
            f"run `sqa train reader --kind ranker --until {next_month(first)}`"
        )
    info = read_reader_info(parent_dir)
    base = ReaderJobSpec(
        **{k: v for k, v in (info.get("spec") or {}).items() if k in ReaderJobSpec.__dataclass_fields__}
    )
    spec = spec or replace(base, kind=kind).for_finetune(max_self_articles=400, eval_every=100, max_minutes=max_minutes)
    data = spec.data_config(data)
    work = ctx.work_dir / "finetune" / f"{parent}-{label}"

    def make_data(session, retriever, snapshot, progress):
        start = indexed_start(snapshot)
        # Replay: older self-labeled questions and gold questions, as many as the new month's (ratio).
        older, _, _ = build_datasets(
            session,
            retriever,
            snapshot,
            train_from=start,
            until=prev,
            val_from=prev,
            cfg=replace(data, max_self_articles=int(data.max_self_articles * replay_ratio), seed=data.seed + 1),
            progress=None,
            self_from=start,
        )
        new, _, counts = build_datasets(
            session, retriever, snapshot, train_from=first, until=until, val_from=until, cfg=data, progress=progress
        )
        new = [ex for ex in new if ex.source == "self"]
        rng = random.Random(data.seed)
        replay = rng.sample(older, min(len(older), int(len(new) * replay_ratio)))
        val_q, _ = gold_questions(session, prev, first)
        b = _Builder(session, retriever, snapshot, data, counts)
        val = [
            ex
            for q in val_q[: data.max_val]
            if (ex := b.example(q.qid, q.text, q.asked, tuple(q.answers), "gold", lambda q=q: gold_passage(session, q)))
            is not None
        ]
        counts.self_labeled, counts.gold, counts.val = len(new), sum(e.source == "gold" for e in replay), len(val)
        counts.left_out = {"replay": len(replay)}
        return new + replay, val, counts

    return _train_and_register(
        ctx,
        job,
        spec=spec,
        label=label,
        work=work,
        make_data=make_data,
        model_factory=lambda: load_trained_model(parent_dir),
        until=until - dt.timedelta(days=1),
        month=month,
        parent=parent,
        activate=activate,
    )
