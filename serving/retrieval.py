"""Retrievers: dense (the encoder over FAISS month shards), BM25 over the same shards, and hybrid
(both, fused). Each implements `Retriever`.

All apply the same date filter (the shards up to as_of, an id-prefix in the boundary month); the
fetched rows are checked against as_of again by `fetch_passages`, which gives them as
`models.reader_base.RetrievedPassage`, the one passage type of the answer path (readers read it).
SQA_RETRIEVER picks one (`make_retriever`); the service, evaluation, training data and the
benchmarks take it from there.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Protocol

from sqlalchemy import select
from sqlalchemy.orm import Session, joinedload

from indexer.dates import day_number
from indexer.fusion import FUSIONS, recency_prior, reciprocal_rank_fusion, weighted_fusion
from indexer.lexical import LexicalIndex
from models.encoders import TextEncoder, query_text
from models.reader_base import RetrievedPassage
from serving.errors import IndexNotReadyError
from serving.index_state import LoadedSnapshot
from store.tables import Passage

log = logging.getLogger(__name__)


class Retriever(Protocol):
    """Finds passages published on or before `as_of` in a snapshot.

    `encoder` is the index's encoder (what the service ingests with, whatever the retriever), `name`
    goes into each answer's versions.
    """

    name: str
    encoder: TextEncoder

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        """(faiss id, score) hits, best first, at most k."""
        ...

    def retrieve(
        self,
        session: Session,
        snapshot: LoadedSnapshot,
        question: str,
        as_of: dt.date,
        top_k: int,
        timings: dict[str, float] | None = None,
    ) -> list[RetrievedPassage]:
        """The hits' passages with their articles, in hit order (none after as_of). A stage that
        has parts of its own (a re-ranker) adds their milliseconds to `timings`."""
        ...


class DenseRetriever:
    """Encodes the question (`models.encoders.query_text`: bare for the packaged MiniLM, dated for a
    DPR version trained so) and searches the snapshot's shards up to as_of.

    Other retrievers (BM25, hybrid: `serving.retrieval`) have the same two methods.
    """

    name = "dense"

    def __init__(self, encoder: TextEncoder) -> None:
        self.encoder = encoder

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        """(faiss id, score) hits, best first."""
        encoder = snapshot.encoder or self.encoder  # the snapshot's own encoder version when it carries one
        qvec = encoder.encode_queries([query_text(encoder, question, as_of)])  # (1, dim)
        scores, ids = snapshot.index.search(qvec, as_of, k)  # (1, k) each, -1 padded
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def retrieve(
        self,
        session: Session,
        snapshot: LoadedSnapshot,
        question: str,
        as_of: dt.date,
        top_k: int,
        timings: dict[str, float] | None = None,
    ) -> list[RetrievedPassage]:
        return fetch_passages(session, self.search(snapshot, question, as_of, top_k), as_of)


def fetch_passages(session: Session, hits: list[tuple[int, float]], as_of: dt.date) -> list[RetrievedPassage]:
    """Rows for (faiss_id, score) hits, in hit order; drops (and logs) anything after as_of."""
    if not hits:
        return []
    rows = (
        session.scalars(
            select(Passage)
            .options(joinedload(Passage.article))  # one query, not one per article
            .where(Passage.faiss_id.in_([h[0] for h in hits]))
        )
        .unique()
        .all()
    )
    by_id = {r.faiss_id: r for r in rows}
    out = []
    for fid, score in hits:
        row = by_id.get(fid)
        if row is None:
            log.warning("passage with faiss id %d is in the index but not in the database", fid)
            continue
        if row.published > as_of:  # cannot happen with a correct index; never let it through
            log.error("passage %d published %s came back for as_of %s: dropped", row.id, row.published, as_of)
            continue
        out.append(
            RetrievedPassage(
                title=row.article.title,
                text=row.text,
                published=row.published,
                passage_id=row.id,
                faiss_id=fid,
                article_id=row.article_id,
                url=row.article.url,
                score=score,
            )
        )
    return out


RETRIEVERS = ("dense", "bm25", "hybrid")
FUSION_DEPTH = 50  # candidates each retriever contributes to a hybrid ranking (at least top_k)


def lexical_index(snapshot: LoadedSnapshot) -> LexicalIndex:
    """The snapshot's BM25 index, or IndexNotReadyError saying how to get one."""
    if snapshot.lexical is None:
        raise IndexNotReadyError(
            snapshot.lexical_error or f"index snapshot {snapshot.snapshot_id} was opened without its BM25 index"
        )
    return snapshot.lexical


class Bm25Retriever:
    """BM25 over the question's words (without the date prefix: its words would favour that day).

    `encoder` is the index's encoder, unused for BM25 search: like every retriever it carries it for
    what the service ingests (the admin ingest and the replay take `service.retriever.encoder`).
    """

    name = "bm25"

    def __init__(self, encoder: TextEncoder) -> None:
        self.encoder = encoder

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        scores, ids = lexical_index(snapshot).search([question], as_of, k)  # (1, k) each, -1 padded
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0]) if i >= 0]

    def retrieve(
        self,
        session: Session,
        snapshot: LoadedSnapshot,
        question: str,
        as_of: dt.date,
        top_k: int,
        timings: dict[str, float] | None = None,
    ) -> list[RetrievedPassage]:
        return fetch_passages(session, self.search(snapshot, question, as_of, top_k), as_of)


class HybridRetriever:
    """Dense and BM25 candidates under the same date filter, fused (rrf or weighted); the score is the fused one.

    `recency` > 0 adds a soft prior on the passage's age at as_of to every fused candidate's score
    (`indexer.fusion.recency_prior`: score - recency * log1p(age in days)) before the top k are kept.
    """

    name = "hybrid"

    def __init__(
        self,
        encoder: TextEncoder,
        *,
        fusion: str = "rrf",
        dense_weight: float = 0.5,
        depth: int = FUSION_DEPTH,
        recency: float = 0.0,
    ) -> None:
        if fusion not in FUSIONS:
            raise ValueError(f"fusion {fusion!r} is not one of {', '.join(FUSIONS)}")
        if not 0.0 <= dense_weight <= 1.0:
            raise ValueError(f"dense_weight {dense_weight} must be in [0, 1]")
        self.encoder = encoder
        self.dense = DenseRetriever(encoder)
        self.lexical = Bm25Retriever(encoder)
        if recency < 0:
            raise ValueError(f"recency {recency} must be >= 0")
        self.fusion, self.dense_weight, self.depth, self.recency = fusion, dense_weight, depth, recency

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        depth = max(k, self.depth)
        lexical = self.lexical.search(snapshot, question, as_of, depth)  # raises first if BM25 is missing
        dense = self.dense.search(snapshot, question, as_of, depth)
        return self.fuse(dense, lexical, as_of, k)

    def fuse(
        self, dense: list[tuple[int, float]], lexical: list[tuple[int, float]], as_of: dt.date, k: int
    ) -> list[tuple[int, float]]:
        """The top k of dense and BM25 (faiss id, score) hits fused as this retriever fuses them
        (and with its recency prior)."""
        depth = max(k, self.depth)
        n = k if not self.recency else 2 * depth  # with a prior, every candidate may still rise
        if self.fusion == "rrf":
            fused = reciprocal_rank_fusion([[i for i, _ in dense], [i for i, _ in lexical]], n)
        else:
            fused = weighted_fusion([dense, lexical], [self.dense_weight, 1.0 - self.dense_weight], n)
        if not self.recency:
            return fused
        return recency_prior(fused, day_number(as_of), self.recency, k)

    def retrieve(
        self,
        session: Session,
        snapshot: LoadedSnapshot,
        question: str,
        as_of: dt.date,
        top_k: int,
        timings: dict[str, float] | None = None,
    ) -> list[RetrievedPassage]:
        return fetch_passages(session, self.search(snapshot, question, as_of, top_k), as_of)


def make_retriever(
    kind: str, encoder: TextEncoder, *, fusion: str = "rrf", dense_weight: float = 0.5, recency: float = 0.0
) -> Retriever:
    """The retriever SQA_RETRIEVER names: "dense", "bm25" or "hybrid" (with SQA_RECENCY_WEIGHT)."""
    if kind == "dense":
        return DenseRetriever(encoder)
    if kind == "bm25":
        return Bm25Retriever(encoder)
    if kind == "hybrid":
        return HybridRetriever(encoder, fusion=fusion, dense_weight=dense_weight, recency=recency)
    raise ValueError(f"retriever {kind!r} is not one of {', '.join(RETRIEVERS)}")
