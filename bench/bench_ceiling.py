"""Where the answers are, and how far cheap changes to retrieval move them: the ceilings behind
issue 18's recall@5 target, on the served pipeline.

    .venv/bin/python -m bench.bench_ceiling --home "$SQA_HOME" --windows 2023-04-01:2023-06-30 \\
        --max-questions 400 --out /tmp/ceiling.json

Over the serving snapshot, for each question of a window (the generation subset and --seed sample
that bench_quality takes), asked as of its own date:

- **where an answer string is at all**: in any stored passage published by the question date; in one
  published at most --recent-days (7) before it; in the question's own articles (bench_quality's
  `own articles`). Numbers make the first loose ("50" is in many passages); the others less so.
- **the first stages**: BM25, dense, their fusion as served, and the served order (with the active
  re-ranker): recall@1/5/10/20/50; BM25, dense and their union at --deep (200).
- **the same words read otherwise**: the served reader's context (its top N passages as it cuts
  them) against the top N whole, the top N with each one's neighbours in its article, the whole
  articles of the top 3, and sentences chosen by `models.reader_context.select_context` from the articles
  of the top 3 and of the top 5, at the served context's number of words, 1.5x and 2x. Each row:
  the share of questions whose context holds an answer, and its mean words.
- **pseudo-relevance feedback** over the served top 3: the dense query moved towards their mean
  embedding (Rocchio, weight 1), BM25's query with their 10 most frequent new words, and both; each
  fused and re-ranked as served, recall@1/5/10/20/50.

Retrieval only: no answer is generated (about 0.25 s a question on 2 idle cores). It prints a table per
window and writes the figures to --out as JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
from sqlalchemy import select
from tqdm import tqdm

from bench.served_questions import (
    KS,
    NotReady,
    each_window,
    open_served,
    own_article_hit,
    parsed_windows,
    question_arguments,
)
from evaluation.metrics import answer_in_text, normalize_answer
from models.encoders import query_text
from models.reader_base import RetrievedPassage
from models.reader_context import content_terms, select_context
from serving.reranking import RerankingRetriever, rerank
from store.tables import Passage

DEFAULT_WINDOWS = "2023-04-01:2023-06-30"
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'-]+")


def first_hit(answers, passages) -> int | None:
    """The 1-based rank of the first passage holding an answer string (date prefix left out), or None."""
    for i, p in enumerate(passages):
        if answer_in_text(list(answers), p.text):
            return i + 1
    return None


def recall(ranks: list[int | None], k: int) -> float:
    return round(100 * sum(1 for r in ranks if r is not None and r <= k) / len(ranks), 1) if ranks else 0.0


def feedback_terms(question: str, passages, n: int = 10) -> list[str]:
    """The `n` most frequent content words of `passages` that the question does not hold."""
    asked = content_terms(question)
    words = Counter(w.lower() for p in passages for w in _WORD.findall(p.text))
    return [w for w, _ in words.most_common() if w not in asked and content_terms(w)][:n]


class Stages:
    """The served retrieval taken apart: BM25, dense, their fusion, the re-ranker, and feedback."""

    def __init__(self, service, snap) -> None:
        from serving.retrieval import Bm25Retriever, DenseRetriever, HybridRetriever  # noqa: PLC0415 (lazy: serving.retrieval imports faiss)

        self.snap = snap
        served = service.retriever
        self.first = served.base if isinstance(served, RerankingRetriever) else served
        # feedback is fused as the served hybrid fuses (a dense or BM25 first stage: hybrid's defaults)
        self.fusion = self.first if isinstance(self.first, HybridRetriever) else HybridRetriever(served.encoder)
        self.model = served.state.current()[0] if isinstance(served, RerankingRetriever) else None
        self.depth = served.depth if isinstance(served, RerankingRetriever) else 0
        self.bm25, self.dense = Bm25Retriever(served.encoder), DenseRetriever(served.encoder)
        self.encoder = snap.encoder or served.encoder

    def reranked(self, question: str, as_of: dt.date, found: list) -> list:
        if self.model is None:
            return found
        return rerank(self.model, question, as_of, found[: self.depth]) + found[self.depth :]

    def feedback(
        self, session, question: str, as_of: dt.date, served: list, dense: list, lexical: list, k: int
    ) -> dict[str, list]:
        """The served order again after pseudo-relevance feedback from the served top 3; `dense` and
        `lexical` are the question's own (faiss id, score) hits, the first k of each taken."""
        from serving.retrieval import fetch_passages, lexical_index  # noqa: PLC0415 (lazy: serving.retrieval imports faiss)

        top = served[:3]
        if not top:
            return {"dense feedback": [], "BM25 feedback": [], "both": []}
        q = self.encoder.encode_queries([query_text(self.encoder, question, as_of)])
        q = q / max(np.linalg.norm(q), 1e-9)
        centre = self.encoder.encode_passages([p.dated_text for p in top]).mean(axis=0, keepdims=True)
        moved = q + centre / max(np.linalg.norm(centre), 1e-9)
        moved = (moved / max(np.linalg.norm(moved), 1e-9)).astype(np.float32)
        scores, ids = self.snap.index.search(moved, as_of, k)
        dense_fb = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        expanded = f"{question} {' '.join(feedback_terms(question, top))}"
        scores, ids = lexical_index(self.snap).search([expanded], as_of, k)
        lexical_fb = [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]
        dense, lexical = dense[:k], lexical[:k]
        out = {}
        for name, (d, b) in {
            "dense feedback": (dense_fb, lexical),
            "BM25 feedback": (dense, lexical_fb),
            "both": (dense_fb, lexical_fb),
        }.items():
            out[name] = self.reranked(question, as_of, fetch_passages(session, self.fusion.fuse(d, b, as_of, k), as_of))
        return out


def contexts(session, service, question, served: list) -> dict[str, list]:
    """What the reader could read: the served context, and the same words spent otherwise."""
    reader = service.reader
    n = service.passages_for(reader)
    whole = list(served)
    ctx = reader.context(question.text, whole[:n]) if hasattr(reader, "context") else whole[:n]
    budget = max(1, sum(len(p.dated_text.split()) for p in ctx))
    articles = list(dict.fromkeys(p.article_id for p in served[:5]))
    rows = (
        session.execute(
            select(Passage.article_id, Passage.ordinal, Passage.text, Passage.published)
            .where(Passage.article_id.in_(articles))
            .order_by(Passage.ordinal)
        ).all()
        if articles
        else []
    )
    by_article: dict[int, list] = {}
    for article, ordinal, text, published in rows:
        by_article.setdefault(article, []).append((ordinal, RetrievedPassage("", text, published)))

    def article_passages(top: int) -> list:
        """The served top passages first, then the rest of their articles in order."""
        first = whole[:top]
        seen = {p.text for p in first}
        rest = [
            rp
            for a in dict.fromkeys(p.article_id for p in served[:top])
            for _, rp in by_article.get(a, [])
            if rp.text not in seen
        ]
        return first + rest

    def neighbours(top: int) -> list:
        out, seen = [], set()
        for p in served[:top]:
            passages = by_article.get(p.article_id, [])
            at = next((i for i, (_, rp) in enumerate(passages) if rp.text == p.text), None)
            for i in (at, at - 1, at + 1) if at is not None else ():
                if 0 <= i < len(passages) and (p.article_id, i) not in seen:
                    seen.add((p.article_id, i))
                    out.append(passages[i][1])
        return out

    out = {
        f"served: top {n} as read": ctx,
        f"top {n} whole": whole[:n],
        f"top {n} and their neighbours": neighbours(n),
        "whole articles of the top 3": [
            rp for a in dict.fromkeys(p.article_id for p in served[:3]) for _, rp in by_article.get(a, [])
        ],
    }
    for top in (3, 5):
        pool = article_passages(top)
        for scale in (1.0, 1.5, 2.0):
            words = max(1, round(budget * scale))
            out[f"sentences of the top {top}'s articles, {scale:g}x words"] = (
                select_context(question.text, pool, budget_words=words, max_passages=len(pool)) if pool else []
            )
    return out


def anywhere(passages: list[tuple[dt.date, str]], question, recent_days: int) -> tuple[bool, bool]:
    """(an answer in a passage published by the question date, in one published within recent_days)."""
    refs = [f" {normalize_answer(a)} " for a in question.answers if normalize_answer(a)]
    since = question.asked - dt.timedelta(days=recent_days)
    hit = [published for published, text in passages if published <= question.asked and any(r in text for r in refs)]
    return bool(hit), any(published >= since for published in hit)


def measure_window(service, db, snap, questions, *, deep: int, recent_days: int, bar: bool) -> dict:
    from serving.retrieval import fetch_passages  # noqa: PLC0415 (lazy: serving.retrieval imports faiss)

    stages = Stages(service, snap)
    last = max(q.asked for q in questions)
    ranks: dict[str, list] = {}
    reads: dict[str, list] = {}
    where = Counter()
    with db.sessions() as session:
        stored = [
            (published, f" {normalize_answer(text)} ")
            for text, published in session.execute(
                select(Passage.text, Passage.published).where(Passage.published <= last)
            )
        ]
        for q in tqdm(questions, desc="questions", unit="q", disable=not bar, file=sys.stderr):
            any_hit, recent_hit = anywhere(stored, q, recent_days)
            where["in a stored passage by the question date"] += any_hit
            where[f"in one published within {recent_days} days before it"] += recent_hit
            where["in the question's own articles"] += own_article_hit(session, q)
            k = max(KS)
            lexical_hits = stages.bm25.search(snap, q.text, q.asked, deep)
            dense_hits = stages.dense.search(snap, q.text, q.asked, deep)
            lexical, dense = (
                fetch_passages(session, lexical_hits, q.asked),
                fetch_passages(session, dense_hits, q.asked),
            )
            fused = stages.first.retrieve(session, snap, q.text, q.asked, max(k, stages.depth))
            served = stages.reranked(q.text, q.asked, fused)
            runs = {
                "BM25": lexical,
                "dense": dense,
                "fused (first stage)": fused,
                "served": served,
                **{
                    f"feedback: {name}": found
                    for name, found in stages.feedback(
                        session, q.text, q.asked, served, dense_hits, lexical_hits, k
                    ).items()
                },
            }
            for name, found in runs.items():
                ranks.setdefault(name, []).append(first_hit(q.answers, found[:k]))
            deep_b, deep_d = first_hit(q.answers, lexical), first_hit(q.answers, dense)
            ranks.setdefault(f"BM25 @{deep}", []).append(deep_b)
            ranks.setdefault(f"dense @{deep}", []).append(deep_d)
            ranks.setdefault(f"union @{deep}", []).append(1 if deep_b or deep_d else None)
            for name, ctx in contexts(session, service, q, served).items():
                reads.setdefault(name, []).append(
                    (first_hit(q.answers, ctx) is not None, sum(len(p.dated_text.split()) for p in ctx))
                )
    n = len(questions)
    return {
        "n": n,
        "answer_is": {name: round(100 * v / n, 1) for name, v in where.items()},
        "recall": {name: {f"@{k}": recall(r, k) for k in KS} for name, r in ranks.items() if "@" not in name},
        "deep": {
            name: round(100 * sum(1 for x in r if x is not None) / n, 1) for name, r in ranks.items() if "@" in name
        },
        "contexts": {
            name: {"answer": round(100 * sum(h for h, _ in v) / n, 1), "words": round(sum(w for _, w in v) / n, 1)}
            for name, v in reads.items()
        },
    }


def print_window(label: str, m: dict) -> None:
    print(f"\n{label}: {m['n']} questions (generation subset)")
    print("  where an answer string is")
    for name, v in m["answer_is"].items():
        print(f"    {name:52s} {v:5.1f}%")
    print("  recall                                                 " + " ".join(f"{f'@{k}':>5s}" for k in KS))
    for name, r in m["recall"].items():
        print(f"    {name:52s} " + " ".join(f"{r[f'@{k}']:5.1f}" for k in KS))
    print("  deeper  " + "   ".join(f"{name} {v:.1f}" for name, v in m["deep"].items()))
    print("  context read                                           answer  words")
    for name, v in m["contexts"].items():
        print(f"    {name:52s} {v['answer']:5.1f}%  {v['words']:6.1f}")


def parse_args(argv):
    ap = question_arguments(__doc__, DEFAULT_WINDOWS, 400)
    ap.add_argument("--deep", type=int, default=200, help="the depth of the BM25 / dense / union row")
    ap.add_argument("--recent-days", type=int, default=7)
    ap.add_argument("--out", help="write the figures here (JSON)")
    args = parsed_windows(ap, argv)
    if args.deep < max(KS) or args.recent_days < 0:
        ap.error(f"--recent-days must be >= 0 and --deep >= {max(KS)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bar = sys.stderr.isatty() or os.environ.get("SQA_PROGRESS") == "1"
    home = Path(args.home)
    try:
        db, service, snap = open_served(home)
    except NotReady as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        print(
            f"served pipeline: retriever {service.retriever.name}, reader {service.reader.name} "
            f"({service.passages_for(service.reader)} passages), snapshot {snap.snapshot_id}"
        )
        results = {}
        for label, _, questions, _ in each_window(db, args):
            t0 = time.perf_counter()
            m = measure_window(service, db, snap, questions, deep=args.deep, recent_days=args.recent_days, bar=bar)
            m["seconds"] = round(time.perf_counter() - t0, 1)
            print_window(label, m)
            results[label] = m
    finally:
        db.close()
    if args.out:
        config = {
            "home": str(home),
            "retriever": service.retriever.name,
            "reader": service.reader.name,
            "snapshot": snap.snapshot_id,
            "max_questions": args.max_questions,
            "seed": args.seed,
            "deep": args.deep,
            "recent_days": args.recent_days,
            "loadavg": list(os.getloadavg()),
        }
        Path(args.out).write_text(json.dumps({"config": config, "windows": results}, indent=1) + "\n")
        print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
