"""Retrievers besides the dense one: BM25 over the snapshot's month shards, and hybrid (both, fused).

All of them take the same arguments as `DenseRetriever.retrieve` and apply the same date filter
(the shards up to as_of, an id-prefix in the boundary month); the fetched rows are checked
against as_of again by `fetch_passages`. SQA_RETRIEVER picks one (`make_retriever`).
"""
from __future__ import annotations

import datetime as dt

from sqlalchemy.orm import Session

from app.services.answering import DenseRetriever, RetrievedPassage, fetch_passages
from app.services.errors import IndexNotReadyError
from app.services.index_state import LoadedSnapshot
from indexer.fusion import FUSIONS, reciprocal_rank_fusion, weighted_fusion
from indexer.lexical import LexicalIndex
from models.encoders import TextEncoder

RETRIEVERS = ("dense", "bm25", "hybrid")
FUSION_DEPTH = 50  # candidates each retriever contributes to a hybrid ranking (at least top_k)


def lexical_index(snapshot: LoadedSnapshot) -> LexicalIndex:
    """The snapshot's BM25 index, or IndexNotReadyError saying how to get one."""
    if snapshot.lexical is None:
        raise IndexNotReadyError(snapshot.lexical_error or
                                 f"index snapshot {snapshot.snapshot_id} was opened without its BM25 index")
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

    def retrieve(self, session: Session, snapshot: LoadedSnapshot, question: str, as_of: dt.date,
                 top_k: int) -> list[RetrievedPassage]:
        return fetch_passages(session, self.search(snapshot, question, as_of, top_k), as_of)


class HybridRetriever:
    """Dense and BM25 candidates under the same date filter, fused (rrf or weighted); the score is the fused one."""

    name = "hybrid"

    def __init__(self, encoder: TextEncoder, *, fusion: str = "rrf", dense_weight: float = 0.5,
                 depth: int = FUSION_DEPTH) -> None:
        if fusion not in FUSIONS:
            raise ValueError(f"fusion {fusion!r} is not one of {', '.join(FUSIONS)}")
        if not 0.0 <= dense_weight <= 1.0:
            raise ValueError(f"dense_weight {dense_weight} must be in [0, 1]")
        self.encoder = encoder
        self.dense = DenseRetriever(encoder)
        self.lexical = Bm25Retriever(encoder)
        self.fusion, self.dense_weight, self.depth = fusion, dense_weight, depth

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        depth = max(k, self.depth)
        lexical = self.lexical.search(snapshot, question, as_of, depth)  # raises first if BM25 is missing
        dense = self.dense.search(snapshot, question, as_of, depth)
        if self.fusion == "rrf":
            return reciprocal_rank_fusion([[i for i, _ in dense], [i for i, _ in lexical]], k)
        return weighted_fusion([dense, lexical], [self.dense_weight, 1.0 - self.dense_weight], k)

    def retrieve(self, session: Session, snapshot: LoadedSnapshot, question: str, as_of: dt.date,
                 top_k: int) -> list[RetrievedPassage]:
        return fetch_passages(session, self.search(snapshot, question, as_of, top_k), as_of)


def make_retriever(kind: str, encoder: TextEncoder, *, fusion: str = "rrf", dense_weight: float = 0.5):
    """The retriever SQA_RETRIEVER names: "dense", "bm25" or "hybrid"."""
    if kind == "dense":
        return DenseRetriever(encoder)
    if kind == "bm25":
        return Bm25Retriever(encoder)
    if kind == "hybrid":
        return HybridRetriever(encoder, fusion=fusion, dense_weight=dense_weight)
    raise ValueError(f"retriever {kind!r} is not one of {', '.join(RETRIEVERS)}")
