"""Reader training jobs: `sqa train reader --until D` and the monthly `sqa finetune --month M`.

Training data are gold questions dated before the cut plus self-labeled questions generated from
articles published before it, each with the passages the serving index retrieves as of the
question's date (the passage holding the answer is put in when retrieval missed it). Validation is
on the gold questions of the last month before the cut, never on anything after it. A job's work
folder (data, checkpoints) is keyed by its parameters, so running the same command again resumes;
the finished model becomes a registered version folder under `models_dir`.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.db.tables import Article, Passage, Question
from evaluation.bakeoff import generation_subset
from evaluation.metrics import answer_in_text
from indexer.chunking import passage_body
from indexer.dates import month_key, month_start, next_month, parse_month
from models.readers import ReaderPassage
from models.training import ReaderTrainer, TrainConfig, TrainExample, load_examples, save_examples
from workers.bakeoff import gold_passage
from workers.progress import fraction_reporter
from workers.runner import JobHandle

if TYPE_CHECKING:
    from workers.context import JobContext

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataConfig:
    n_passages: int = 5  # passages per training example
    retrieve_k: int = 10  # retrieved before the gold passage is ensured among the first n_passages
    max_self_articles: int = 1200  # articles sampled for self-labeled questions
    self_per_article: int = 2
    max_val: int = 120  # validation questions (gold, last month before the cut)
    seed: int = 0


@dataclass
class DataCounts:
    gold: int = 0
    self_labeled: int = 0
    val: int = 0
    gold_inserted: int = 0  # examples whose answer-holding passage retrieval missed
    skipped_no_gold_passage: int = 0
    left_out: dict | None = None


class _Builder:
    """Turns questions into TrainExamples with the serving index as of each question's date."""

    def __init__(self, session: Session, retriever, snapshot, cfg: DataConfig, counts: DataCounts) -> None:
        self.session, self.retriever, self.snapshot, self.cfg, self.counts = session, retriever, snapshot, cfg, counts
        self.rng = random.Random(cfg.seed)

    def example(self, qid: str, question: str, as_of: dt.date, answers: tuple[str, ...], source: str,
                gold_row) -> TrainExample | None:
        n = self.cfg.n_passages
        found = self.retriever.retrieve(self.session, self.snapshot, question, as_of, self.cfg.retrieve_k)
        ps = [ReaderPassage(p.title, p.text, p.published) for p in found]
        top = ps[:n]
        if not any(answer_in_text(list(answers), passage_body(p.text, p.published)) for p in top):
            row = gold_row() if callable(gold_row) else gold_row
            if row is None:
                self.counts.skipped_no_gold_passage += 1
                return None
            gold = ReaderPassage(row.article.title, row.text, row.published)
            top = [p for p in top if p.text != gold.text][: n - 1]
            top.insert(self.rng.randrange(len(top) + 1), gold)
            self.counts.gold_inserted += 1
        return TrainExample(qid, question, as_of, answers, tuple(top), source)


def _self_gold_row(session: Session, url: str, answer: str, sentence: str):
    """The source article's passage that holds the self-labeled answer (and its sentence, if it can)."""
    rows = session.scalars(select(Passage).join(Article).where(Article.url == url)
                           .order_by(Passage.ordinal, Passage.id)).all()
    holding = [r for r in rows if answer_in_text([answer], passage_body(r.text, r.published))]
    for r in holding:
        if sentence[:60] in r.text:
            return r
    return holding[0] if holding else None


def gold_questions(session: Session, first: dt.date, before: dt.date) -> tuple[list[Question], dict]:
    rows = session.scalars(select(Question).where(Question.asked >= first, Question.asked < before)
                           .order_by(Question.asked, Question.qid)).all()
    kept, left_out = generation_subset(rows)
    return kept, dict(left_out)


def self_labeled(session: Session, first: dt.date, before: dt.date, cfg: DataConfig, *, per_article: int | None = None,
                 max_articles: int | None = None):
    """Self-labeled questions from a seeded sample of the articles published in [first, before)."""
    from models.selflabel import generate_questions

    ids = list(session.scalars(select(Article.id).where(Article.published >= first, Article.published < before)
                               .order_by(Article.id)))
    rng = random.Random(cfg.seed)
    rng.shuffle(ids)
    ids = sorted(ids[: max_articles if max_articles is not None else cfg.max_self_articles])
    articles = session.scalars(select(Article).where(Article.id.in_(ids))).all() if ids else []
    return list(generate_questions(articles, max_per_article=per_article or cfg.self_per_article, seed=cfg.seed))


def indexed_start(snapshot) -> dt.date:
    """The first day the serving index has passages for (questions before it have no evidence)."""
    spans = [e.span for e in snapshot.manifest.shards]
    if not spans:
        raise ValueError("the index is empty: run `sqa ingest` first")
    return min(s[0] for s in spans)


def build_datasets(session: Session, retriever, snapshot, *, train_from: dt.date, until: dt.date,
                   val_from: dt.date, cfg: DataConfig, progress=None, self_from: dt.date | None = None,
                   replay: list[TrainExample] | None = None) -> tuple[list[TrainExample], list[TrainExample], DataCounts]:
    """(train, val, counts). Gold questions in [train_from, val_from) train; those in [val_from,
    until) validate; self-labeled questions from articles in [self_from or train_from, until) train."""
    counts = DataCounts()
    b = _Builder(session, retriever, snapshot, cfg, counts)
    golds, left_out = gold_questions(session, train_from, until)
    counts.left_out = left_out
    val_q = [q for q in golds if q.asked >= val_from]
    random.Random(cfg.seed).shuffle(val_q)
    val_q = val_q[: cfg.max_val]
    train_q = [q for q in golds if q.asked < val_from]
    selfq = self_labeled(session, self_from or train_from, until, cfg)
    total = len(train_q) + len(val_q) + len(selfq)
    if progress:
        progress.stage("retrieve", total)
    train: list[TrainExample] = list(replay or [])
    val: list[TrainExample] = []
    for dest, q in [(train, q) for q in train_q] + [(val, q) for q in val_q]:
        ex = b.example(q.qid, q.text, q.asked, tuple(q.answers), "gold", lambda q=q: gold_passage(session, q))
        if ex is not None:
            dest.append(ex)
        if progress:
            progress.advance()
    for i, g in enumerate(selfq):
        ex = b.example(f"self-{g.published}-{i}", g.question, g.published, (g.answer,), "self",
                       lambda g=g: _self_gold_row(session, g.url, g.answer, g.sentence))
        if ex is not None:
            train.append(ex)
        if progress:
            progress.advance()
    counts.gold = sum(ex.source == "gold" for ex in train)
    counts.self_labeled = sum(ex.source == "self" for ex in train)
    counts.val = len(val)
    return train, val, counts


# ---- jobs ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ReaderJobSpec:
    kind: str = "fid"  # fid | extractive | ranker (workers/train_ranker.py)
    n_passages: int = 5  # in training; inference uses `infer_passages`
    infer_passages: int = 10
    max_passage_tokens: int = 192
    backbone: str = "minilm"  # fid only: minilm | seq2seq
    base: str = ""  # fid seq2seq: a local T5/BART folder
    lr: float = 0.0  # 0: the kind's default
    batch_size: int = 2
    max_epochs: int = 3
    eval_every: int = 200
    patience: int = 3
    max_minutes: float = 0.0
    max_self_articles: int = 600
    seed: int = 0

    @property
    def learning_rate(self) -> float:
        """`lr`, or the kind's default: the FiD decoder's fresh cross-attention wants more."""
        return self.lr or (2e-4 if self.kind == "fid" else 5e-5)

    def data_config(self, data: DataConfig | None = None) -> DataConfig:
        """The data settings this spec implies (its passages, articles and seed win)."""
        return replace(data or DataConfig(), n_passages=self.n_passages, max_self_articles=self.max_self_articles,
                       seed=self.seed)


def _digest(*parts) -> str:
    """A stable short key of the job's parameters (a rerun with the same ones resumes)."""
    text = json.dumps([asdict(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _new_model(spec: ReaderJobSpec):
    if spec.kind == "fid":
        from models.fid import FiDConfig, FiDModel

        return FiDModel.warm_start(FiDConfig(backbone=spec.backbone, base=spec.base, n_passages=spec.infer_passages,
                                             max_passage_tokens=spec.max_passage_tokens))
    if spec.kind == "extractive":
        from models.extractive import SpanConfig, SpanModel

        return SpanModel.warm_start(SpanConfig(n_passages=spec.infer_passages,
                                               max_passage_tokens=spec.max_passage_tokens))
    raise ValueError(f"reader kind {spec.kind!r} is unknown (use fid, extractive or ranker)")


def serving_snapshot(ctx: JobContext):
    """(encoder, the serving snapshot) for building training data; ValueError when nothing is indexed."""
    encoder = ctx.load_encoder()
    state = ctx.open_index_state(encoder, False)
    state.refresh()
    snapshot = state.current()
    if snapshot is None:
        raise ValueError("no index has been built yet: run `sqa ingest --through YYYY-MM` first")
    return encoder, snapshot


def _train_and_register(ctx: JobContext, job: JobHandle, *, spec: ReaderJobSpec, label: str, work: Path, make_data,
                        model_factory, until: dt.date, month: str | None = None, parent: str | None = None,
                        activate: bool | None = None) -> str:
    """Shared by training and fine-tuning: data (cached in `work`), the loop, the version folder.
    Run it under the reader-training lock (`READER_TRAINING_LOCK`): one reader training per SQA_HOME."""
    from app.services.retrieval import DenseRetriever
    from app.services.reader_registry import new_version_name, register_version
    from models.trained import write_reader_info

    db, progress = ctx.db, job
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if (work / "val.jsonl").exists() and (work / "train.jsonl").exists():
        train, val = load_examples(work / "train.jsonl"), load_examples(work / "val.jsonl")
        counts = {"train": len(train), "val": len(val), "data": "reused from an interrupted run"}
    else:
        encoder, snapshot = serving_snapshot(ctx)
        with db.sessions() as session:
            train, val, dc = make_data(session, DenseRetriever(encoder), snapshot, progress)
        save_examples(work / "val.jsonl", val)
        save_examples(work / "train.jsonl", train)
        counts = {"train": len(train), "val": len(val), **asdict(dc)}
    log.info("training data: %s", counts)
    job.update(counts=counts)
    if not train:
        raise ValueError("no training examples: are the months before the cut ingested?")
    model = model_factory()
    tcfg = TrainConfig(lr=spec.learning_rate, batch_size=spec.batch_size, max_epochs=spec.max_epochs,
                       eval_every=spec.eval_every,
                       patience=spec.patience, max_minutes=spec.max_minutes, seed=spec.seed,
                       n_passages=spec.n_passages)
    trainer = ReaderTrainer(model, spec.kind, tcfg, work / "run")
    t1 = time.perf_counter()
    report = fraction_reporter(progress, log)

    result = trainer.train(train, val, report)
    version = new_version_name(spec.kind, label)
    dest = ctx.models_dir / version
    shutil.copytree(trainer.best_dir, dest)
    info = {"kind": spec.kind, "version": version, "parent_version": parent, "trained_until": until.isoformat(),
            "month": month, "spec": asdict(spec), "data": counts, "validation": result.best,
            "history": result.history, "stopped": result.stopped, "steps": result.steps,
            "train_seconds": result.seconds}
    write_reader_info(dest, info)
    with db.sessions() as session, session.begin():
        make_active = bool(activate)  # a new version serves only once someone activates it
        register_version(session, version=version, kind=spec.kind, path=version, parent_version=parent,
                         trained_until=until, month=month, job_id=job.job_id, activate=make_active,
                         models_dir=ctx.models_dir,
                         metrics={"validation": result.best, "steps": result.steps, "stopped": result.stopped,
                                  "train": counts.get("train"), "val": counts.get("val")})
        job.update_in(session, counts={"version": version, "activated": make_active, "validation": result.best},
                      timings={"data_s": round(t1 - t0, 1), "train_s": round(time.perf_counter() - t1, 1)})
    shutil.rmtree(work, ignore_errors=True)
    return version


def run_train_job(ctx: JobContext, job: JobHandle, *, until: dt.date, spec: ReaderJobSpec | None = None,
                  data: DataConfig | None = None, activate: bool | None = None) -> str:
    """`sqa train reader --until D`: a new version trained on what is dated before `until`.
    Run it under the reader-training lock (the CLI and the API do, through the job runner)."""
    spec = spec or ReaderJobSpec()
    data = spec.data_config(data)
    if spec.kind == "ranker":  # no network to train: a logistic regression (workers/train_ranker.py)
        from workers.train_ranker import run_ranker_job

        return run_ranker_job(ctx, job, until=until, spec=spec, data=data, activate=activate)
    val_from = month_start(until - dt.timedelta(days=1))
    work = ctx.work_dir / "train" / f"{spec.kind}-{until}-{_digest(spec, data)}"

    def make_data(session, retriever, snapshot, progress):
        first = indexed_start(snapshot)
        if first >= val_from:
            raise ValueError(f"the index starts {first}: ingest months before {month_key(val_from)} to train "
                             f"(validation uses {month_key(val_from)})")
        return build_datasets(session, retriever, snapshot, train_from=first, until=until, val_from=val_from,
                              cfg=data, progress=progress)

    return _train_and_register(ctx, job, spec=spec, label=str(until), work=work, make_data=make_data,
                               model_factory=lambda: _new_model(spec), until=until, activate=activate)


def run_finetune_job(ctx: JobContext, job: JobHandle, *, month: str, spec: ReaderJobSpec | None = None,
                     data: DataConfig | None = None, replay_ratio: float = 1.0, activate: bool = True,
                     max_minutes: float = 0.0) -> str:
    """`sqa finetune --month M`: continue from the active version on M's self-labeled questions
    plus a replay sample of older self-labeled and gold questions (so it does not forget);
    validated on the gold questions of the month before M. The new version becomes active."""
    from app.services.reader_registry import active_version, check_servable
    from models.trained import load_trained_model, read_reader_info

    first = parse_month(month)
    until = next_month(first)
    with ctx.sessions() as session:
        row = active_version(session)
        if row is None:
            raise ValueError("no trained reader to fine-tune: run `sqa train reader --until YYYY-MM-DD` first")
        parent_dir = check_servable(row, ctx.models_dir)
        parent, kind = row.version, row.kind
    if kind == "ranker":
        raise ValueError(f"the active version {parent} is a ranker, which is refitted rather than fine-tuned: "
                         f"run `sqa train reader --kind ranker --until {next_month(first)}`")
    info = read_reader_info(parent_dir)
    base = ReaderJobSpec(**{k: v for k, v in (info.get("spec") or {}).items() if k in ReaderJobSpec.__dataclass_fields__})
    spec = spec or replace(base, kind=kind, lr=replace(base, kind=kind).learning_rate / 2, max_epochs=1,
                           max_self_articles=400, eval_every=100, patience=2, max_minutes=max_minutes)
    data = spec.data_config(data)
    prev = month_start(first - dt.timedelta(days=1))
    work = ctx.work_dir / "finetune" / f"{parent}-{month}"

    def make_data(session, retriever, snapshot, progress):
        start = indexed_start(snapshot)
        # Replay: older self-labeled questions and gold questions, as many as the new month's (ratio).
        older, _, _ = build_datasets(session, retriever, snapshot, train_from=start, until=prev, val_from=prev,
                                     cfg=replace(data, max_self_articles=int(data.max_self_articles * replay_ratio),
                                                 seed=data.seed + 1), progress=None, self_from=start)
        new, _, counts = build_datasets(session, retriever, snapshot, train_from=first, until=until, val_from=until,
                                        cfg=data, progress=progress)
        new = [ex for ex in new if ex.source == "self"]
        rng = random.Random(data.seed)
        replay = rng.sample(older, min(len(older), int(len(new) * replay_ratio)))
        val_q, _ = gold_questions(session, prev, first)
        b = _Builder(session, retriever, snapshot, data, counts)
        val = [ex for q in val_q[: data.max_val] if (ex := b.example(
            q.qid, q.text, q.asked, tuple(q.answers), "gold", lambda q=q: gold_passage(session, q))) is not None]
        counts.self_labeled, counts.gold, counts.val = len(new), sum(e.source == "gold" for e in replay), len(val)
        counts.left_out = {"replay": len(replay)}
        return new + replay, val, counts

    return _train_and_register(ctx, job, spec=spec, label=month, work=work, make_data=make_data,
                               model_factory=lambda: load_trained_model(parent_dir), until=until - dt.timedelta(days=1),
                               month=month, parent=parent, activate=activate)
