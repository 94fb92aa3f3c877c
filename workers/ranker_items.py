"""The candidate ranker's input, made once per question: retrieved as of the question's own date
with the serving index, the passages annotated with spaCy. Shared by `sqa estimate`
(workers/estimate.py) and `sqa train reader --kind ranker` (workers/train_ranker.py).

Both go to a cache file under SQA_HOME/work/estimate/, keyed by the index snapshot, the number
of passages and the retriever, appended as it goes, so an interrupted run resumes where it stopped and a training
run reuses what an estimate retrieved (and the other way round).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from evaluation.questions import DatedQuestion
from models.candidates import RankerItem, annotate_passages, annotated
from models.readers import FirstEntityReader
from models.selflabel import load_nlp
from workers.progress import Progress

if TYPE_CHECKING:
    from workers.job_context import JobContext


class ItemCache:
    """Retrieved-and-annotated questions, one JSON line each, keyed by question id."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: dict[str, dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:  # a line cut by a crash: redo that question
                    continue
                self.records[rec["qid"]] = rec
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, records: list[dict]) -> None:
        """Append records with one write on an O_APPEND file, so that two processes filling the same
        cache (an estimate and a training) do not interleave inside a line."""
        data = "".join(json.dumps(rec) + "\n" for rec in records).encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        for rec in records:
            self.records[rec["qid"]] = rec


def cache_path(work_dir: Path, retriever: str, snapshot_id: str, passages: int) -> Path:
    """The cache of a snapshot, a passage count and the retriever that found them
    (`JobContext.served_retriever()`: SQA_RETRIEVER with its fusion settings and the serving re-ranker;
    other settings retrieve other passages)."""
    key = hashlib.sha256(f"{snapshot_id}|{passages}|{retriever}".encode()).hexdigest()[:16]
    return work_dir / "estimate" / f"items-{key}.jsonl"


def prepare_items(
    ctx: JobContext,
    questions: Sequence[DatedQuestion],
    passages: int,
    progress: Progress,
    *,
    batch: int = 32,
    embed: bool = True,
) -> tuple[dict[str, RankerItem], np.ndarray | None]:
    """Retrieve and annotate each question once (cached).

    Args:
        questions: gold or self-labeled questions, each retrieved as of its `asked` day.
        passages: retrieved passages per question (part of the cache key).
        embed: also encode the questions (the adversarial splits need them).
    Returns:
        (items by qid, (n, dim) question embeddings in input order, or None when `embed` is false).
    """
    encoder = ctx.load_encoder()
    service = ctx.load_answer_service(FirstEntityReader())  # retrieves only: no reader is loaded
    service.index_state.refresh()
    snap = service.index_state.current()
    if snap is None:
        raise ValueError(f"no index snapshot in {ctx.home}: run `sqa ingest` first")
    cache = ItemCache(cache_path(ctx.work_dir, ctx.served_retriever(), snap.snapshot_id, passages))
    todo = [q for q in questions if q.qid not in cache.records]
    progress.stage("retrieve+annotate", len(questions))
    progress.advance(len(questions) - len(todo))
    nlp = load_nlp() if todo else None
    for i in range(0, len(todo), batch):
        chunk = todo[i : i + batch]
        found = [service.answer(q.text, q.asked, passages, snapshot=snap, read=False).passages for q in chunk]
        bodies = [p.text for ps in found for p in ps]
        notes = iter(annotate_passages(nlp, bodies))
        records = [
            {
                "qid": q.qid,
                "question": q.text,
                "asked": q.asked.isoformat(),
                "answers": list(q.answers),
                "passages": [{"score": p.score, "days_old": (q.asked - p.published).days, **next(notes)} for p in ps],
            }
            for q, ps in zip(chunk, found)
        ]
        cache.add(records)
        progress.advance(len(chunk))
    items = {}
    for q in questions:
        rec = cache.records[q.qid]
        items[q.qid] = RankerItem(
            q.qid,
            rec["question"],
            tuple(rec["answers"]),
            tuple(
                annotated(p, rank=r, score=p["score"], days_old=p["days_old"]) for r, p in enumerate(rec["passages"])
            ),
        )
    if not embed:
        return items, None
    vectors = encoder.encode_queries([q.text for q in questions]) if questions else np.zeros((0, encoder.dim))
    return items, np.asarray(vectors)
