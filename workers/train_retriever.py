"""`sqa train retriever --until D`: fine-tune the question and passage encoders (DPR) on what is
dated before the cut, and register the result as an encoder version.

Training pairs: each gold question dated before the validation month, and questions generated from
the articles published before it (`models/selflabel/`, the reader's generator), dated as the
service dates a question ("Today is ... . <question>"). The positive is the passage that holds the
answer: for a gold question the first BM25 hit (as of its date) that does, else its cited
article's passage; for a self-labeled one the passage its sentence came from. The hard negative is
the best BM25 hit that holds no answer and comes from another article.

Validation (the gold questions of the last month before the cut, never anything after it): each
question's BM25 top 20 and dense top 20 (the serving index) pooled over all of them, with the date
filter, re-ranked by the encoder being trained; answer-string recall@1/5/20 and MRR on that pool,
against BM25's own ranking. The pairs and the pool are cached in the job's work folder, which is
keyed by the parameters, so running the same command again resumes; a run with other towers or
epochs on the same data reuses them.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import shutil
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from evaluation.metrics import answer_in_text
from indexer.chunking import dated_text
from indexer.dates import day_number, month_key, month_start
from models.dpr import BiEncoder, DprConfig, Pair, train_biencoder
from models.encoders import QUERY_FORMATS, packaged_minilm_path, question_in_format
from workers.bakeoff_gold import gold_passage
from workers.progress import fraction_reporter
from workers.reader_data import (
    DataConfig,
    _self_gold_row,
    asked_after,
    digest,
    gold_questions,
    indexed_start,
    self_labeled,
    serving_snapshot,
)
from workers.runner import JobHandle

if TYPE_CHECKING:
    from workers.job_context import JobContext

log = logging.getLogger(__name__)

RETRIEVER_TRAINING_LOCK = "retriever-training"
KS = (1, 5, 20)
METRIC = "recall@5"


@dataclass(frozen=True)
class RetrieverDataConfig:
    retrieve_k: int = 30  # BM25 hits searched for a positive and a hard negative
    max_self_articles: int = 1500
    self_per_article: int = 2
    max_self_ratio: float = 2.0  # self-labeled pairs kept: at most this many per gold pair
    self_lag_days: int = 6  # a self-labeled question is asked 0..this many days after its article
    max_val: int = 100
    pool_k: int = 20  # BM25 and dense hits per validation question pooled
    seed: int = 0
    # How a question is written for the encoder, in training, validation and then serving
    # (encoder.json's query_format): "dated" ("Today is <date>. <question>") or "bare".
    query_format: str = "dated"

    def __post_init__(self) -> None:
        if self.query_format not in QUERY_FORMATS:
            raise ValueError(f"query format {self.query_format!r} is not one of {', '.join(QUERY_FORMATS)}")

    def query(self, question: str, as_of: dt.date) -> str:
        """The question as the encoder reads it, in this config's format."""
        return question_in_format(question, as_of, self.query_format)


@dataclass(frozen=True)
class ValItem:
    query: str
    day: int  # day number of the question date: pool passages after it are filtered out
    hits: tuple[int, ...]  # pool indices whose passage holds an answer
    bm25: tuple[int, ...]  # pool indices in BM25 order (its own top pool_k)


def _holds(answers, passage) -> bool:
    return answer_in_text(list(answers), passage.text)


def _pair(
    session, bm25, snapshot, question: str, as_of: dt.date, answers, positive_row, source: str, cfg: RetrieverDataConfig
) -> Pair | None:
    """The pair for one question, or None without a positive."""
    from serving.retrieval import fetch_passages  # noqa: PLC0415 (lazy: serving.retrieval imports faiss)

    hits = fetch_passages(session, bm25.search(snapshot, question, as_of, cfg.retrieve_k), as_of)
    positive = None if source == "self" else next((p for p in hits if _holds(answers, p)), None)
    if positive is None:
        row = positive_row()
        if row is None or row.published > as_of:
            return None
        pos_text, pos_article = dated_text(row.text, row.published), row.article_id
    else:
        pos_text, pos_article = positive.dated_text, positive.article_id
    negative = next((p.dated_text for p in hits if p.article_id != pos_article and not _holds(answers, p)), None)
    return Pair(cfg.query(question, as_of), pos_text, negative, source)


def _keep(pairs: list, missing: dict, pair: Pair | None, source: str) -> None:
    if pair is None:
        missing[source] += 1
    else:
        pairs.append(pair)


def build_data(
    session,
    encoder,
    snapshot,
    *,
    train_from: dt.date,
    val_from: dt.date,
    until: dt.date,
    cfg: RetrieverDataConfig,
    progress=None,
) -> tuple[list[Pair], dict, dict]:
    """(training pairs, validation {items, pool}, counts)."""
    from serving.retrieval import Bm25Retriever, DenseRetriever, fetch_passages  # noqa: PLC0415 (lazy: serving.retrieval imports faiss)

    bm25, dense = Bm25Retriever(encoder), DenseRetriever(encoder)
    golds, left_out = gold_questions(session, train_from, until)
    train_q = [q for q in golds if q.asked < val_from]
    val_q = [q for q in golds if q.asked >= val_from]
    random.Random(cfg.seed).shuffle(val_q)
    val_q = val_q[: cfg.max_val]
    selfq = self_labeled(
        session,
        train_from,
        val_from,
        DataConfig(max_self_articles=cfg.max_self_articles, self_per_article=cfg.self_per_article, seed=cfg.seed),
        progress=progress,
    )  # minutes of spaCy: shown
    if progress:
        progress.stage("data", len(train_q) + len(selfq) + len(val_q))
    pairs, missing = [], {"gold": 0, "self": 0}
    for q in train_q:
        p = _pair(
            session, bm25, snapshot, q.text, q.asked, q.answers, lambda q=q: gold_passage(session, q), "gold", cfg
        )
        _keep(pairs, missing, p, "gold")
        if progress:
            progress.advance()
    rng = random.Random(cfg.seed)
    rng.shuffle(selfq)
    wanted = len(pairs) + int(cfg.max_self_ratio * len(pairs))  # gold pairs + at most ratio x as many self
    last_day = val_from - dt.timedelta(days=1)
    for g in selfq:
        if progress:
            progress.advance()
        if len(pairs) >= wanted:
            continue
        # asked a few days after the article, as real questions are (median 3 days on RealTimeQA):
        # dated on the article's own day, the question's date prefix would match the passage's
        as_of = asked_after(g.published, rng, last_day, cfg.self_lag_days)
        p = _pair(
            session,
            bm25,
            snapshot,
            g.question,
            as_of,
            (g.answer,),
            lambda g=g: _self_gold_row(session, g.url, g.answer, g.sentence),
            "self",
            cfg,
        )
        _keep(pairs, missing, p, "self")

    pool: dict[int, tuple[str, int]] = {}  # faiss id -> (dated text: what the encoder reads, day number)
    index_of: dict[int, int] = {}
    items = []
    for q in val_q:
        lexical = fetch_passages(session, bm25.search(snapshot, q.text, q.asked, cfg.pool_k), q.asked)
        found = lexical + fetch_passages(session, dense.search(snapshot, q.text, q.asked, cfg.pool_k), q.asked)
        for p in found:
            if p.faiss_id not in index_of:
                index_of[p.faiss_id] = len(pool)
                pool[p.faiss_id] = (p.dated_text, day_number(p.published))
        hits = sorted({index_of[p.faiss_id] for p in found if _holds(q.answers, p)})
        items.append(
            ValItem(
                cfg.query(q.text, q.asked),
                day_number(q.asked),
                tuple(hits),
                tuple(index_of[p.faiss_id] for p in lexical),
            )
        )
        if progress:
            progress.advance()
    counts = {
        "gold_pairs": sum(p.source == "gold" for p in pairs),
        "self_pairs": sum(p.source == "self" for p in pairs),
        "with_hard_negative": sum(p.negative is not None for p in pairs),
        "no_positive": missing,
        "val_questions": len(items),
        "val_with_answer_in_pool": sum(bool(i.hits) for i in items),
        "pool_passages": len(pool),
        "left_out": dict(left_out),
    }
    val = {
        "items": [asdict(i) for i in items],
        "texts": [t for t, _ in pool.values()],
        "days": [d for _, d in pool.values()],
    }
    return pairs, val, counts


def pool_figures(ranked: list[list[int]], items: list[ValItem]) -> dict:
    """Recall@k (an answer-holding passage in the top k) and MRR over the validation questions."""
    n = max(1, len(items))
    out = {
        f"recall@{k}": round(100 * sum(bool(set(r[:k]) & set(i.hits)) for r, i in zip(ranked, items)) / n, 2)
        for k in KS
    }
    rr = [next((1 / (j + 1) for j, x in enumerate(r) if x in set(i.hits)), 0.0) for r, i in zip(ranked, items)]
    out["mrr"] = round(float(np.mean(rr)) if rr else 0.0, 4)
    return out


def validator(val: dict):
    """validate(model) -> figures: the pool re-ranked by the model, with the date filter."""
    items = [ValItem(**{**i, "hits": tuple(i["hits"]), "bm25": tuple(i["bm25"])}) for i in val["items"]]
    days = np.asarray(val["days"], dtype=np.int64)  # (pool,)

    def validate(model) -> dict:
        if not items:
            return {f"recall@{k}": 0.0 for k in KS} | {"mrr": 0.0}
        p = model.encode_passages(val["texts"])  # (pool, dim)
        q = model.encode_queries([i.query for i in items])  # (n, dim)
        scores = q @ p.T  # (n, pool)
        ranked = []
        for row, item in zip(scores, items):
            row = np.where(days <= item.day, row, -np.inf)
            order = np.argsort(-row)[: max(KS)]
            ranked.append([int(j) for j in order if np.isfinite(row[j])])
        return pool_figures(ranked, items)

    return validate, items


def run_train_retriever_job(
    ctx: JobContext,
    job: JobHandle,
    *,
    until: dt.date,
    cfg: DprConfig | None = None,
    data: RetrieverDataConfig | None = None,
) -> str:
    """Train an encoder version on what is dated before `until`; returns its name. Run it under
    the retriever-training lock (`RETRIEVER_TRAINING_LOCK`; the CLI does, through the job runner)."""
    cfg, data = cfg or DprConfig(), data or RetrieverDataConfig()
    db, progress = ctx.db, job
    val_from = month_start(until - dt.timedelta(days=1))
    key = digest(cfg, data)[:6]
    # the data (pairs, validation pool) are kept for other runs on them (the other towers, say);
    # the run folder (checkpoints) goes once the version is saved
    work = ctx.work_dir / "train-retriever" / f"data-{until}-{digest(data)[:6]}"
    run = ctx.work_dir / "train-retriever" / f"run-{until}-{key}"
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if (work / "pairs.jsonl").exists() and (work / "val.json").exists():
        pairs = [Pair(**json.loads(line)) for line in (work / "pairs.jsonl").read_text().splitlines()]
        val = json.loads((work / "val.json").read_text())
        counts = json.loads((work / "counts.json").read_text())
    else:
        encoder, snapshot = serving_snapshot(ctx, lexical=True)
        if snapshot.lexical is None:
            raise ValueError(snapshot.lexical_error or "the index has no BM25 files: run `sqa index bm25`")
        first = indexed_start(snapshot)
        if first >= val_from:
            raise ValueError(
                f"the index starts {first}: ingest months before {month_key(val_from)} to train "
                f"(validation uses {month_key(val_from)})"
            )
        with db.sessions() as session:
            pairs, val, counts = build_data(
                session,
                snapshot.encoder or encoder,
                snapshot,
                train_from=first,
                val_from=val_from,
                until=until,
                cfg=data,
                progress=progress,
            )
        (work / "val.json").write_text(json.dumps(val))
        (work / "counts.json").write_text(json.dumps(counts))
        (work / "pairs.jsonl").write_text("".join(json.dumps(p.to_json()) + "\n" for p in pairs))
    log.info("retriever training data: %s", counts)
    job.update(counts=counts)
    if len(pairs) < cfg.batch_size:
        raise ValueError(f"only {len(pairs)} training pairs: are the months before the cut ingested?")
    validate, items = validator(val)
    bm25_figures = pool_figures([list(i.bm25) for i in items], items)
    model = BiEncoder(packaged_minilm_path(), cfg, device=ctx.torch_device())
    report = fraction_reporter(progress, log)

    t1 = time.perf_counter()
    result = train_biencoder(model, pairs, run, validate, metric=METRIC, report=report)
    version = f"dpr-{until}-{cfg.towers}-{key}"
    # trained and validated on questions in data.query_format (Pair.query, ValItem.query): serving asks
    # it the same way
    info = {
        "version": version,
        "kind": "dpr",
        "base": "all-MiniLM-L6-v2",
        "query_format": data.query_format,
        "trained_until": until.isoformat(),
        "created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "data": counts,
        "data_config": asdict(data),
        "validation": {
            "best": result.best,
            "bm25": bm25_figures,
            "untuned": result.history[0] if result.history else {},
        },
        "history": result.history,
        "steps": result.steps,
        "stopped": result.stopped,
        "train_seconds": result.seconds,
        "data_seconds": round(t1 - t0, 1),
    }
    model.save(ctx.encoders_dir / version, info)
    job.update(
        counts={"version": version, "validation": info["validation"]},
        timings={"data_s": round(t1 - t0, 1), "train_s": round(time.perf_counter() - t1, 1)},
    )
    shutil.rmtree(run, ignore_errors=True)
    return version


def describe(info: dict) -> str:
    """One line per figure set of a version's validation, for the CLI."""
    v = info.get("validation", {})
    rows = [("bm25", v.get("bm25", {})), ("untuned", v.get("untuned", {})), (info["version"], v.get("best", {}))]
    return "\n".join(
        f"  {name:40s} "
        + "  ".join(f"{k} {f.get(k, float('nan')):6.2f}" for k in [f"recall@{k}" for k in KS] + ["mrr"])
        for name, f in rows
    )
