"""Training data for the readers: gold questions dated before a cut and self-labeled questions from
the articles before it, each with the passages the index retrieves as of the question's date (the
passage holding the answer is put in when retrieval missed it). Shared by the reader training jobs
(workers/train.py, workers/train_ranker.py), the retriever job and `sqa estimate`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import random
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from sqlalchemy import select
from sqlalchemy.orm import Session

from evaluation.bakeoff import generation_subset
from evaluation.metrics import answer_in_text
from evaluation.questions import DatedQuestion
from models.encoders import query_text
from models.reader_base import RetrievedPassage
from models.selflabel import generate_questions
from models.training import TrainExample
from store.tables import Article, Passage, Question
from workers.bakeoff_gold import gold_passage

if TYPE_CHECKING:
    from workers.job_context import JobContext


@dataclass(frozen=True)
class DataConfig:
    n_passages: int = 5  # passages per training example
    retrieve_k: int = 10  # retrieved before the gold passage is ensured among the first n_passages
    max_self_articles: int = 1200  # articles sampled for self-labeled questions
    self_per_article: int = 2
    max_val: int = 120  # validation questions (gold, last month before the cut)
    seed: int = 0
    gold: bool = True  # False: self-labeled questions only, for training and validation


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

    def example(
        self, qid: str, question: str, as_of: dt.date, answers: tuple[str, ...], source: str, gold_row
    ) -> TrainExample | None:
        n = self.cfg.n_passages
        found = self.retriever.retrieve(self.session, self.snapshot, question, as_of, self.cfg.retrieve_k)
        top = list(found[:n])
        if not any(answer_in_text(list(answers), p.text) for p in top):
            row = gold_row() if callable(gold_row) else gold_row
            if row is None:
                self.counts.skipped_no_gold_passage += 1
                return None
            gold = RetrievedPassage(
                row.article.title,
                row.text,
                row.published,
                passage_id=row.id,
                faiss_id=row.faiss_id,
                article_id=row.article_id,
                url=row.article.url,
            )
            top = [p for p in top if p.text != gold.text][: n - 1]
            top.insert(self.rng.randrange(len(top) + 1), gold)
            self.counts.gold_inserted += 1
        return TrainExample(qid, question, as_of, answers, tuple(top), source)


def _self_gold_row(session: Session, url: str, answer: str, sentence: str):
    """The source article's passage that holds the self-labeled answer (and its sentence, if it can)."""
    rows = session.scalars(
        select(Passage).join(Article).where(Article.url == url).order_by(Passage.ordinal, Passage.id)
    ).all()
    holding = [r for r in rows if answer_in_text([answer], r.text)]
    for r in holding:
        if sentence[:60] in r.text:
            return r
    return holding[0] if holding else None


def gold_questions(session: Session, first: dt.date, before: dt.date) -> tuple[list[DatedQuestion], dict]:
    rows = session.scalars(
        select(Question).where(Question.asked >= first, Question.asked < before).order_by(Question.asked, Question.qid)
    ).all()
    kept, left_out = generation_subset([DatedQuestion.of(q) for q in rows])
    return kept, dict(left_out)


def self_labeled(
    session: Session,
    first: dt.date,
    before: dt.date,
    cfg: DataConfig,
    *,
    per_article: int | None = None,
    max_articles: int | None = None,
    progress=None,
):
    """Self-labeled questions from a seeded sample of the articles published in [first, before);
    `progress` gets a "self-label" stage advanced article by article (spaCy reads ~8 a second)."""
    ids = list(
        session.scalars(
            select(Article.id).where(Article.published >= first, Article.published < before).order_by(Article.id)
        )
    )
    rng = random.Random(cfg.seed)
    rng.shuffle(ids)
    ids = sorted(ids[: max_articles if max_articles is not None else cfg.max_self_articles])
    articles = session.scalars(select(Article).where(Article.id.in_(ids))).all() if ids else []

    def counted(items):
        for item in items:
            yield item
            progress.advance()

    if progress:
        progress.stage("self-label", len(articles))
    return list(
        generate_questions(
            counted(articles) if progress else articles,
            max_per_article=per_article or cfg.self_per_article,
            seed=cfg.seed,
        )
    )


def asked_after(published: dt.date, rng: random.Random, last_day: dt.date, lag_days: int = 6) -> dt.date:
    """The date a self-labeled question is asked: 0..lag_days after its article (real questions come
    a few days after the news: median 3 days on RealTimeQA), never after `last_day`."""
    return min(published + dt.timedelta(days=rng.randint(0, lag_days)), last_day)


def indexed_start(snapshot) -> dt.date:
    """The first day the serving index has passages for (questions before it have no evidence)."""
    spans = [e.span for e in snapshot.manifest.shards]
    if not spans:
        raise ValueError("the index is empty: run `sqa ingest` first")
    return min(s[0] for s in spans)


def build_datasets(
    session: Session,
    retriever,
    snapshot,
    *,
    train_from: dt.date,
    until: dt.date,
    val_from: dt.date,
    cfg: DataConfig,
    progress=None,
    self_from: dt.date | None = None,
    replay: list[TrainExample] | None = None,
) -> tuple[list[TrainExample], list[TrainExample], DataCounts]:
    """(train, val, counts). Gold questions in [train_from, val_from) train; those in [val_from,
    until) validate; self-labeled questions from articles in [self_from or train_from, until) train.
    Without a gold question in [val_from, until), the self-labeled ones of its articles validate;
    with `cfg.gold` False no gold question is used at all (training on the news alone)."""
    counts = DataCounts()
    b = _Builder(session, retriever, snapshot, cfg, counts)
    golds, left_out = gold_questions(session, train_from, until) if cfg.gold else ([], None)
    counts.left_out = left_out
    val_q = [q for q in golds if q.asked >= val_from]
    random.Random(cfg.seed).shuffle(val_q)
    val_q = val_q[: cfg.max_val]
    train_q = [q for q in golds if q.asked < val_from]
    selfq = self_labeled(session, self_from or train_from, until, cfg, progress=progress)
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
        ex = b.example(
            f"self-{g.published}-{i}",
            g.question,
            g.published,
            (g.answer,),
            "self",
            lambda g=g: _self_gold_row(session, g.url, g.answer, g.sentence),
        )
        if ex is not None:
            train.append(ex)
        if progress:
            progress.advance()
    if not val and val_from < until:
        # No gold question in the held-back month (a store of news only): validate on the
        # self-labeled questions of its articles instead, and train on the rest.
        val = [ex for ex in train if ex.source == "self" and ex.as_of >= val_from][: cfg.max_val]
        held = {id(ex) for ex in val}
        train = [ex for ex in train if id(ex) not in held]
    counts.gold = sum(ex.source == "gold" for ex in train)
    counts.self_labeled = sum(ex.source == "self" for ex in train)
    counts.val = len(val)
    return train, val, counts


def digest(*parts) -> str:
    """A stable short key of the job's parameters (a rerun with the same ones resumes)."""
    text = json.dumps([asdict(p) for p in parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def retrieval_key(ctx: JobContext, encoder, snapshot, *, rerank: bool) -> str:
    """What a question's retrieved passages depend on beyond the data config: the index snapshot, the
    retriever (SQA_RETRIEVER with its fusion settings; `rerank`: and the re-ranker serving now), the
    encoder and the form of the question it reads (`models.encoders.query_text`). Work an interrupted
    run left behind is reused only under the same key: after a new ingest, another retriever,
    re-ranker or encoder, its passages are not the ones a run would retrieve now."""
    form = query_text(encoder, "Q?", dt.date(2000, 1, 3))
    retriever = ctx.served_retriever() if rerank else ctx.retriever
    text = f"{snapshot.snapshot_id}|{retriever}|{encoder.name}|{form}"
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def serving_snapshot(ctx: JobContext, *, lexical: bool = False):
    """(encoder, the serving snapshot) for building training data (`lexical`: with its BM25 files);
    ValueError when nothing is indexed."""
    encoder = ctx.load_encoder()
    state = ctx.open_index_state(encoder, lexical)
    state.refresh()
    snapshot = state.current()
    if snapshot is None:
        raise ValueError("no index has been built yet: run `sqa ingest --through YYYY-MM` first")
    return encoder, snapshot
