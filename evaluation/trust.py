"""How far a user can trust an answer: whether the passages read state it (grounded) and how sure
the reader was (confidence), and how often each kind of answer is right.

The same figures come out of the benchmark (`bench/bench_quality.py`) and every evaluation run
(`workers/evaluate.py`), so a quarter's report says whether "high confidence" still means what it
meant when the bands were set (README, "How far to trust an answer").
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from evaluation.temporal import quarter_index

# The ask page's bands, [from, to): set on the RealTimeQA slice, where "high" answers were right
# 57-69% of the time and "low" ones 3-5% (1.0 counts in "high").
CONFIDENCE_BANDS: tuple[tuple[str, float, float], ...] = (("high", 0.7, 1.0), ("medium", 0.15, 0.7), ("low", 0.0, 0.15))


def confidence_band(confidence: float | None) -> str:
    """The band's name ("high", "medium", "low"), or "" without a confidence.

    Example:
        >>> [confidence_band(c) for c in (0.9, 0.7, 0.3, 0.1, None)]
        ['high', 'high', 'medium', 'low', '']
    """
    if confidence is None:
        return ""
    return next(name for name, lo, _ in CONFIDENCE_BANDS if confidence >= lo)


@dataclass(frozen=True)
class Judged:
    """One answer as the user saw it, and whether it was right."""

    right: bool  # exact match with a gold answer
    grounded: bool | None  # a passage read states it (None: not known, e.g. stored before it was)
    confidence: float | None  # the reader's probability of its answer (None: the reader gives none)


def _pct(part: int, whole: int) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def grounded_split(judged: Iterable[Judged]) -> dict:
    """The share of answers a passage read states, and EM on those and on the rest; {} when no
    answer says whether it is grounded.

    Example:
        >>> grounded_split([Judged(True, True, None), Judged(False, True, None), Judged(False, False, None)])
        {'share': 66.7, 'n': 2, 'em_grounded': 50.0, 'em_otherwise': 0.0}
    """
    known = [j for j in judged if j.grounded is not None]
    if not known:
        return {}
    inside = [j for j in known if j.grounded]
    outside = [j for j in known if not j.grounded]
    return {
        "share": _pct(len(inside), len(known)),
        "n": len(inside),
        "em_grounded": _pct(sum(j.right for j in inside), len(inside)),
        "em_otherwise": _pct(sum(j.right for j in outside), len(outside)),
    }


def confidence_bands(judged: Iterable[Judged]) -> dict:
    """For each band: the share of the answers in it and their EM; and the AUC, the chance that a
    right answer has a higher confidence than a wrong one (0.5: the confidence tells nothing; None
    when all are right or all wrong). {} when no answer has a confidence.

    Example:
        >>> c = confidence_bands([Judged(True, None, 0.9), Judged(False, None, 0.5), Judged(False, None, 0.1)])
        >>> [(b["band"], b["n"], b["em"]) for b in c["bands"]], c["auc"]
        ([('high', 1, 100.0), ('medium', 1, 0.0), ('low', 1, 0.0)], 1.0)
    """
    scored = [j for j in judged if j.confidence is not None]
    if not scored:
        return {}
    bands = []
    for name, lo, hi in CONFIDENCE_BANDS:
        inside = [j for j in scored if confidence_band(j.confidence) == name]
        bands.append(
            {
                "band": name,
                "from": lo,
                "to": hi,
                "share": _pct(len(inside), len(scored)),
                "n": len(inside),
                "em": _pct(sum(j.right for j in inside), len(inside)),
            }
        )
    return {
        "n": len(scored),
        "bands": bands,
        "auc": auc([j.confidence for j in scored if j.right], [j.confidence for j in scored if not j.right]),
    }


def auc(positives: list[float], negatives: list[float]) -> float | None:
    """The chance that a random positive scores above a random negative (ties count half), by ranks
    in O(n log n); None when either side is empty.

    Example:
        >>> auc([0.9, 0.4], [0.4, 0.1])
        0.875
    """
    if not positives or not negatives:
        return None
    from scipy.stats import rankdata  # noqa: PLC0415 (lazy: scipy.stats, ~0.6 s to import); average ranks over ties

    ranks = rankdata(list(positives) + list(negatives))
    n_pos, n_neg = len(positives), len(negatives)
    return round(float((ranks[:n_pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)), 3)


def trust_summary(judged: Iterable[Judged]) -> dict:
    """{"answers", "grounded", "confidence"}: the two splits above over the same answers."""
    judged = list(judged)
    return {"answers": len(judged), "grounded": grounded_split(judged), "confidence": confidence_bands(judged)}


def shown_quarters(trust: dict) -> dict:
    """`trust_by_quarter`'s entries to show: all of them, but "all" when there is one quarter
    (it says the same again)."""
    return {q: t for q, t in trust.items() if not (q == "all" and len(trust) == 2)}


def describe(trust: dict) -> list[str]:
    """A trust summary (`trust_summary`) as lines for a terminal: the grounded split, then the bands.

    Example:
        >>> describe(trust_summary([Judged(True, True, 0.9), Judged(False, False, 0.1)]))[0]
        'grounded answers  50.0 % (n 1; a passage read states them): EM 100.0 on those, 0.0 on the rest'
    """
    lines = []
    g, c = trust.get("grounded"), trust.get("confidence")
    if g:
        lines.append(
            f"grounded answers  {g['share']:.1f} % (n {g['n']}; a passage read states them): "
            f"EM {g['em_grounded']:.1f} on those, {g['em_otherwise']:.1f} on the rest"
        )
    if c:
        lines.append(
            "by confidence     "
            + "   ".join(
                f"{b['band']} {b['from']:.2f}-{b['to']:.2f}: {b['share']:.1f} % EM {b['em']:.1f}" for b in c["bands"]
            )
            + f"   (n {c['n']}, AUC {c['auc']})"
        )
    return lines


def trust_by_quarter(rows: Iterable[dict]) -> dict:
    """Trust figures per test quarter, over the answers given under the state of the question's own
    quarter (what was served then) or, without one, the newest state that answered it; "all" pools
    those. {} when no row was answered by the reader.

    Args:
        rows: per-question results (`workers.evaluate.run_rows`): test_quarter, state_quarter,
            metrics (with "em" when the reader answered), grounded, confidence.
    """
    picked: dict[str, tuple[str, list[Judged]]] = {}
    for row in rows:
        em = row["metrics"].get("em")
        if em is None:
            continue
        test, state = row["test_quarter"], row["state_quarter"]
        held = picked.get(test)
        if held is None or _better_state(state, held[0], test):
            held = picked[test] = (state, [])
        if held[0] == state:
            held[1].append(Judged(em == 1.0, row.get("grounded"), row.get("confidence")))
    if not picked:
        return {}
    out = {
        test: trust_summary(judged) for test, (_, judged) in sorted(picked.items(), key=lambda kv: quarter_index(kv[0]))
    }
    out["all"] = trust_summary([j for _, judged in picked.values() for j in judged])
    return out


def _better_state(state: str, held: str, test: str) -> bool:
    """The test quarter's own state beats any other; else the newer one."""
    if held == test:
        return False
    return state == test or quarter_index(state) > quarter_index(held)
