"""Fusing ranked lists from several retrievers (dense and BM25) into one ranking.

Two rules, both over the candidates each retriever returned (a passage missing from a list
contributes nothing from it):
  rrf       reciprocal rank fusion (Cormack et al., 2009): sum over lists of 1 / (c + rank),
            rank from 1. Needs no score calibration; c = 60 as in the paper.
  weighted  a weighted sum of scores min-max normalised within each list to [0, 1].
Ties are broken by the order in which passages first appear (the first list first), so the
result is deterministic.

Example:
    >>> reciprocal_rank_fusion([[7, 3, 5], [3, 9]], k=3)
    [(3, 0.0325...), (7, 0.0163...), (9, 0.0161...)]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from indexer.ids import id_day_numbers

RRF_C = 60
FUSIONS = ("rrf", "weighted")


def _ranked(scores: dict[int, float], first_seen: dict[int, int], k: int) -> list[tuple[int, float]]:
    order = sorted(scores, key=lambda pid: (-scores[pid], first_seen[pid]))
    return [(pid, scores[pid]) for pid in order[:k]]


def reciprocal_rank_fusion(rankings: Sequence[Sequence[int]], k: int, *, c: int = RRF_C) -> list[tuple[int, float]]:
    """Fuse id lists (best first) by reciprocal rank.

    Args:
        rankings: one list of passage ids per retriever, best first, no repeats within a list.
        k: how many to return.
        c: the RRF constant.
    Returns:
        up to k (id, fused score) pairs, best first.
    """
    if k < 1 or c < 0:
        raise ValueError(f"k must be >= 1 and c >= 0, got k={k}, c={c}")
    scores: dict[int, float] = {}
    first_seen: dict[int, int] = {}
    for ranking in rankings:
        for rank, pid in enumerate(ranking, start=1):
            first_seen.setdefault(pid, len(first_seen))
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (c + rank)
    return _ranked(scores, first_seen, k)


def weighted_fusion(
    scored: Sequence[Sequence[tuple[int, float]]], weights: Sequence[float], k: int
) -> list[tuple[int, float]]:
    """Fuse (id, score) lists by a weighted sum of min-max normalised scores.

    Args:
        scored: one list of (passage id, score) per retriever, best first.
        weights: one non-negative weight per list.
        k: how many to return.
    Returns:
        up to k (id, fused score) pairs, best first; a list whose scores are all equal counts 1 each.
    """
    if len(weights) != len(scored) or any(w < 0 for w in weights):
        raise ValueError(f"need one non-negative weight per list, got {list(weights)} for {len(scored)} lists")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    scores: dict[int, float] = {}
    first_seen: dict[int, int] = {}
    for pairs, weight in zip(scored, weights):
        if not pairs:
            continue
        values = [s for _, s in pairs]
        lo, hi = min(values), max(values)
        for pid, s in pairs:
            first_seen.setdefault(pid, len(first_seen))
            norm = (s - lo) / (hi - lo) if hi > lo else 1.0
            scores[pid] = scores.get(pid, 0.0) + weight * norm
    return _ranked(scores, first_seen, k)


def recency_prior(
    hits: Sequence[tuple[int, float]], as_of_day: int, weight: float, k: int, *, scale_days: float = 1.0
) -> list[tuple[int, float]]:
    """Re-score (id, score) hits with a soft penalty on their age at `as_of`: score - weight *
    log1p(age_days / scale_days), the age read from the id (`indexer.ids`); best first, at most k.

    News questions are mostly about the last days before their date, but not always: a soft prior
    keeps older evidence reachable where a hard window would drop it. Ties keep the input order.
    """
    if weight < 0 or scale_days <= 0:
        raise ValueError(f"weight must be >= 0 and scale_days > 0, got {weight} and {scale_days}")
    if not hits:
        return []
    ids = np.fromiter((h[0] for h in hits), dtype=np.int64, count=len(hits))
    age = np.maximum(0, as_of_day - id_day_numbers(ids)).astype(np.float64)  # (n,) days
    scores = np.fromiter((h[1] for h in hits), dtype=np.float64, count=len(hits)) - weight * np.log1p(age / scale_days)
    order = np.argsort(-scores, kind="stable")[:k]
    return [(int(ids[i]), float(scores[i])) for i in order]
