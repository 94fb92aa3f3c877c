"""The reader bake-off's pure parts: the generation subset, published baselines, scoring, latency
summaries. `bench/bench_readers.py` (its parts in `bench/bakeoff_runs.py`) wires them to the database,
the index and the readers; the gold-containing passage is looked up in the database by
`workers/bakeoff_gold.py`.

Questions are `evaluation.questions.DatedQuestion`s (`DatedQuestion.of` a stored row). Scores are
fractions in [0, 1]; the primary metric is `PRIMARY_METRIC` ("f1"), greater is better.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from evaluation.metrics import PRIMARY_METRIC, exact_match, normalize_answer, token_f1
from evaluation.questions import DatedQuestion
from evaluation.subsets import needs_choices
from indexer.jsonl import iter_jsonl
from indexer.records import ImportReport

__all__ = [
    "PRIMARY_METRIC",
    "GREATER_IS_BETTER",
    "MAX_ANSWER_TOKENS",
    "generation_subset",
    "load_baseline_predictions",
    "score",
    "latency_summary",
]

GREATER_IS_BETTER = True
MAX_ANSWER_TOKENS = 5  # RealTimeQA's generation setting: short answers only

NO_GOLD = "no gold answer"
NEEDS_CHOICES = "needs its choices"


def over_tokens_reason(max_tokens: int) -> str:
    return f"answer over {max_tokens} tokens"


def generation_subset(
    questions: Iterable[DatedQuestion], max_tokens: int = MAX_ANSWER_TOKENS
) -> tuple[list[DatedQuestion], Counter]:
    """Questions a generative reader can be scored on, and why the others were left out.

    Kept: the first gold answer has 1..max_tokens tokens after SQuAD normalisation, and the
    question makes sense without its multiple-choice options. Each left-out question is counted
    under the first reason that applies: "no gold answer", "needs its choices",
    "answer over N tokens". `max_tokens=0` keeps answers of any length.

    Example (the 369 RealTimeQA questions of 2023-04..06):
        >>> kept, left_out = generation_subset(questions)
        >>> len(kept), dict(left_out)
        (353, {'needs its choices': 8, 'answer over 5 tokens': 8})
    """
    kept, left_out = [], Counter()
    for q in questions:
        gold = normalize_answer(q.answers[0]) if q.answers else ""
        if not gold:
            left_out[NO_GOLD] += 1
        elif needs_choices(q.text):
            left_out[NEEDS_CHOICES] += 1
        elif max_tokens and len(gold.split()) > max_tokens:
            left_out[over_tokens_reason(max_tokens)] += 1
        else:
            kept.append(q)
    return kept, left_out


def _baseline_dir(root: Path) -> Path:
    root = Path(root)
    return root / "baseline_results" if (root / "baseline_results").is_dir() else root


def baseline_files(root: Path, system: str) -> list[Path]:
    """`YYYYMMDD_qa_<system>.jsonl[.gz]` under root (a RealTimeQA tree or its baseline_results/),
    sorted by week; a week present both plain and gzipped is read once (the plain file)."""
    name = re.compile(rf"^(\d{{8}})_qa_{re.escape(system)}\.jsonl(\.gz)?$")
    chosen: dict[tuple[str, str], Path] = {}
    for path in sorted(_baseline_dir(root).rglob(f"*_qa_{system}.jsonl*")):
        match = name.match(path.name)
        if match and path.is_file():
            key = (str(path.parent), match.group(1))
            if key not in chosen or not path.name.endswith(".gz"):
                chosen[key] = path
    return sorted(chosen.values(), key=lambda p: (p.name, str(p)))


def load_baseline_predictions(root: Path, system: str, report: ImportReport | None = None) -> dict[str, str]:
    """A published system's predictions, {question_id: prediction}.

    Args:
        root: a RealTimeQA tree (holding baseline_results/) or baseline_results/ itself.
        system: the file-name suffix, e.g. "open_rag_gcs_gen" for `*_qa_open_rag_gcs_gen.jsonl.gz`.
        report: where malformed lines and records are counted (by reason, with examples), and
            `duplicates`: an id already seen in an earlier week (the first is kept, as the importer
            keeps the first question with that id).

    Returns:
        Predictions by question id; {} when no file matches (the caller says so).
    """
    report = report if report is not None else ImportReport()
    out: dict[str, str] = {}
    for path in baseline_files(root, system):
        for lineno, obj in iter_jsonl(path, report):
            qid, prediction = obj.get("question_id"), obj.get("prediction")
            if not isinstance(qid, (str, int)) or isinstance(qid, bool) or str(qid).strip() == "":
                report.skip("baseline: no question_id", f"{path}:{lineno}")
                continue
            if not isinstance(prediction, (str, int, float)) or isinstance(prediction, bool):
                report.skip("baseline: no prediction", f"{path}:{lineno}")
                continue
            qid = str(qid).strip()
            if qid in out:
                report.duplicates += 1
                continue
            out[qid] = str(prediction)
    return out


def score(predictions: dict[str, str], questions: Sequence[DatedQuestion]) -> dict[str, float]:
    """EM and token F1 (each the best over the question's gold answers), averaged over `questions`.

    A question without a prediction scores 0 and is not counted in "answered"; an empty-string
    prediction is an answer (scored as given).

    Returns:
        {"n", "answered", "em", "f1"}; em and f1 are fractions (0.0 when n is 0).
    """
    n = len(questions)
    em = f1 = 0.0
    answered = 0
    for q in questions:
        pred = predictions.get(q.qid)
        if pred is None:
            continue
        answered += 1
        em += exact_match(pred, q.answers)
        f1 += token_f1(pred, q.answers)
    return {"n": n, "answered": answered, "em": em / n if n else 0.0, "f1": f1 / n if n else 0.0}


def latency_summary(ms: Sequence[float]) -> dict[str, float | int | None]:
    """{"n", "p50_ms", "p95_ms", "mean_ms"} of per-question times in ms (numpy's linear
    percentiles); None values when there are none."""
    if not len(ms):
        return {"n": 0, "p50_ms": None, "p95_ms": None, "mean_ms": None}
    x = np.asarray(ms, dtype=float)
    return {
        "n": int(x.size),
        "p50_ms": round(float(np.percentile(x, 50)), 2),
        "p95_ms": round(float(np.percentile(x, 95)), 2),
        "mean_ms": round(float(x.mean()), 2),
    }
