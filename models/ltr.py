"""A feature re-ranker: re-orders the first stage's candidates by a logistic model over a few
question/passage features, learnt by the project from dated questions before the cut.

Where the cross-encoder (models/reranker.py) reads every (question, passage) pair with a BERT and
needs a GPU to be trained and served in time, this model reads features that cost microseconds:
the first stage's own score and rank, the passage's age at the question's date, how much of the
question (each word weighted by its rarity among the candidates) the passage, its best sentence and
its title hold, whether the question's bigrams and names occur in it, and how many candidates share
its article. It learns from the same items (`workers.train_reranker.build_items`: the first stage's
candidates, a candidate that holds an answer string a positive) and is validated and activated the
same way. A version folder holds `reranker.json` alone: the feature names, their means and spreads,
the coefficients (plain JSON, no pickle).

    # items: [{"query", "cands": [{"input", "age", "score", "article", "hit"}]}]
    model = FeatureReranker.fit(items)
    model.score_candidates("Who won ...?", cands)  # (n,) float64, higher is better
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from models.reader_context import STOPWORDS, content_terms

INFO_FILE = "reranker.json"  # models.reranker.INFO_FILE: the same folder layout
KIND = "features"

FEATURES = (
    "first_stage_score",
    "inverse_rank",
    "log_rank",
    "log_age",
    "age_above_newest",
    "question_weight",
    "question_share",
    "best_sentence_weight",
    "title_share",
    "bigrams",
    "names_share",
    "same_article",
    "article_first",
    "numbers_asked",
)
_SENTENCES = re.compile(r"(?<=[.!?])\s+")
_NAME = re.compile(r"\b[A-Z][a-zA-Z'’]+")
_NUMBER = re.compile(r"\d")
_COUNT_QUESTION = re.compile(
    r"\b(how many|how much|what percent|what percentage|what year|what age|how old|"
    r"how long|what number)\b",
    re.I,
)


def _words(text: str) -> list[str]:
    """The content words of `text` in order (lower case, stopwords dropped): what bigrams are made of."""
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in STOPWORDS]


def _bigrams(words: list[str]) -> set[tuple[str, str]]:
    return set(zip(words, words[1:]))


def candidate_features(question: str, cands: Sequence[dict]) -> np.ndarray:
    """(len(cands), len(FEATURES)) features of the first stage's candidates, in its order.

    Each candidate is {"input": "title. passage text", "title": str (optional), "age": days at the
    question's date, "score": first-stage score, "article": its article (optional)}."""
    n = len(cands)
    out = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if not n:
        return out
    asked = content_terms(question)
    terms = [content_terms(c["input"]) for c in cands]
    df = Counter(t for ts in terms for t in ts & asked)
    weight = {t: math.log(1 + n / df[t]) if df[t] else math.log(1 + n) for t in asked}
    total = sum(weight.values()) or 1.0
    q_bigrams = _bigrams(_words(question))
    names = {m.group(0).lower() for m in _NAME.finditer(question[1:])} - {
        "what",
        "which",
        "who",
        "how",
        "when",
        "where",
    }
    newest = min(c["age"] for c in cands)
    articles = Counter(c.get("article") for c in cands)
    seen_articles: set = set()
    counting = 1.0 if _COUNT_QUESTION.search(question) else 0.0
    for i, c in enumerate(cands):
        text = c["input"]
        held = terms[i] & asked
        sentences = [content_terms(s) & asked for s in _SENTENCES.split(text)] or [set()]
        title_terms = content_terms(c.get("title") or "") & asked
        article = c.get("article")
        lower = text.lower()
        out[i] = (
            float(c["score"]),
            1.0 / (1 + i),
            math.log1p(i),
            math.log1p(max(0, c["age"])),
            math.log1p(max(0, c["age"] - newest)),
            sum(weight[t] for t in held) / total,
            len(held) / max(1, len(asked)),
            max(sum(weight[t] for t in s) for s in sentences) / total,
            len(title_terms) / max(1, len(asked)),
            len(q_bigrams & _bigrams(_words(text))) / max(1, len(q_bigrams)),
            sum(name in lower for name in names) / max(1, len(names)) if names else 0.0,
            math.log(articles[article]) if article is not None else 0.0,
            0.0 if article is None or article in seen_articles else 1.0,
            counting * min(1.0, len(_NUMBER.findall(text)) / 10),
        )
        seen_articles.add(article)
    return out


def learnable(items: Sequence[dict]) -> list[dict]:
    """The items whose candidates hold both a positive and a negative: the others teach nothing
    about order."""
    return [i for i in items if any(c["hit"] for c in i["cands"]) and not all(c["hit"] for c in i["cands"])]


class FeatureReranker:
    """A logistic model over `candidate_features`, standardised: score = w . (x - mean) / spread + b."""

    kind = KIND

    def __init__(
        self,
        mean: Sequence[float],
        spread: Sequence[float],
        coef: Sequence[float],
        intercept: float,
        *,
        info: dict | None = None,
        name: str = "features",
    ) -> None:
        if not (len(mean) == len(spread) == len(coef) == len(FEATURES)):
            raise ValueError(f"a feature re-ranker needs {len(FEATURES)} means, spreads and coefficients")
        self.mean, self.spread = np.asarray(mean, dtype=np.float64), np.asarray(spread, dtype=np.float64)
        self.coef, self.intercept = np.asarray(coef, dtype=np.float64), float(intercept)
        self.info, self.name = info or {}, name

    @classmethod
    def fit(cls, items: Sequence[dict], *, c: float = 1.0, seed: int = 0) -> FeatureReranker:
        """Fit on items whose candidates hold at least one positive and one negative (the others
        teach nothing about order): every candidate is an example, positives weighted so that each
        question's positives and negatives weigh the same."""
        from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 (lazy: sklearn, only when fitting)

        xs, ys, ws = [], [], []
        for item in learnable(items):
            hits = [bool(cd["hit"]) for cd in item["cands"]]
            x = candidate_features(item["query"], item["cands"])
            n_pos = sum(hits)
            xs.append(x)
            ys += hits
            ws += [0.5 / n_pos if h else 0.5 / (len(hits) - n_pos) for h in hits]
        if not xs:
            raise ValueError("no question has both a candidate with its answer and one without: nothing to learn")
        x = np.vstack(xs)
        mean, spread = x.mean(axis=0), x.std(axis=0)
        spread[spread == 0] = 1.0
        model = LogisticRegression(C=c, max_iter=2000, random_state=seed)
        model.fit((x - mean) / spread, np.asarray(ys), sample_weight=np.asarray(ws))
        return cls(mean, spread, model.coef_[0], float(model.intercept_[0]))

    def score_candidates(self, question: str, cands: Sequence[dict]) -> np.ndarray:
        """(len(cands),) scores, higher is better; the candidates as `candidate_features` takes them."""
        if not cands:
            return np.zeros(0)
        return (candidate_features(question, cands) - self.mean) / self.spread @ self.coef + self.intercept

    def to_json(self) -> dict:
        return {
            "features": list(FEATURES),
            "mean": self.mean.tolist(),
            "spread": self.spread.tolist(),
            "coef": self.coef.tolist(),
            "intercept": self.intercept,
        }

    def save(self, folder: Path | str, info: dict) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / INFO_FILE).write_text(
            json.dumps({**info, "kind": KIND, "model": self.to_json()}, indent=1, default=str)
        )

    @classmethod
    def load(cls, folder: Path | str) -> FeatureReranker:
        folder = Path(folder)
        info = json.loads((folder / INFO_FILE).read_text())
        model = info.get("model") or {}
        if list(model.get("features", [])) != list(FEATURES):
            raise ValueError(
                f"{folder / INFO_FILE} was trained on other features ({model.get('features')}): "
                "train it again with `sqa train reranker --kind features`"
            )
        return cls(
            model["mean"],
            model["spread"],
            model["coef"],
            model["intercept"],
            info=info,
            name=info.get("version", folder.name),
        )


__all__ = ["FEATURES", "FeatureReranker", "KIND", "candidate_features", "learnable"]
