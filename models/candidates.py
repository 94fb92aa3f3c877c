"""A fast learned reader for estimating performance under many splits: rank the named entities of
the retrieved passages as answer candidates with a logistic regression.

Why it exists: the split strategies (evaluation/splits.py) train a model once per split, k times
per strategy. A neural reader costs minutes to hours per training on this machine's CPU; this
ranker trains in about a second on a thousand questions, yet learns what a reader must learn
(which entity type answers "who"/"how many"/"which country", how close the candidate is to the
question's words, how high its passage ranked, how often it recurs), so its estimates move with
the training data the way a reader's do.

Candidates are spaCy entities (packaged en_core_web_sm) of the question's retrieved passages,
merged by SQuAD-normalised text. Passages are annotated once (`annotate_passages`) into plain
JSON-able records, so a cache file can hold them. A candidate is a positive example when it
matches a gold answer (exact match, or token F1 >= 0.6).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from evaluation.metrics import exact_match, normalize_answer, token_f1

_WORD = re.compile(r"[a-z0-9]+")
_STOP = set(
    """a an the of in on at to for from by with and or but is are was were be been being has have
had do does did this that these those it its as into about after before over under than then there
their his her he she they them who whom whose what which when where why how many much today week year
month day s""".split()
)
_WH = (
    "how many",
    "how much",
    "how long",
    "how old",
    "how",
    "who",
    "whom",
    "whose",
    "what",
    "which",
    "when",
    "where",
    "why",
)
POSITIVE_F1 = 0.6


@dataclass(frozen=True)
class Mention:
    text: str
    label: str  # spaCy entity label: PERSON, GPE, ORG, DATE, CARDINAL, ...
    sentence: int  # index into the passage's sentences


@dataclass(frozen=True)
class AnnotatedPassage:
    """A retrieved passage with its sentences (as word sets) and entity mentions."""

    rank: int  # 0 = the top retrieved passage
    score: float
    days_old: int  # question date - publication date
    sentences: tuple[frozenset[str], ...]
    mentions: tuple[Mention, ...]


@dataclass(frozen=True)
class RankerItem:
    qid: str
    question: str
    answers: tuple[str, ...]
    passages: tuple[AnnotatedPassage, ...] = field(default_factory=tuple)


def words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def annotate_passages(nlp, bodies: Sequence[str], *, batch_size: int = 64) -> list[dict]:
    """spaCy sentences and entities of each passage body, as JSON-able dicts.

    Returns:
        [{"sentences": [[word, ...], ...], "mentions": [[text, label, sentence], ...]}] in input order.
    """
    out = []
    for doc in nlp.pipe(bodies, batch_size=batch_size):
        sents = list(doc.sents)
        starts = [s.start for s in sents]
        mentions = []
        for ent in doc.ents:
            idx = int(np.searchsorted(starts, ent.start, side="right") - 1)
            mentions.append([ent.text, ent.label_, max(idx, 0)])
        out.append({"sentences": [sorted(set(words(s.text))) for s in sents], "mentions": mentions})
    return out


def annotated(record: dict, *, rank: int, score: float, days_old: int) -> AnnotatedPassage:
    """An AnnotatedPassage from an `annotate_passages` record and its place in a retrieval."""
    return AnnotatedPassage(
        rank,
        score,
        days_old,
        tuple(frozenset(s) for s in record["sentences"]),
        tuple(Mention(t, lab, s) for t, lab, s in record["mentions"]),
    )


def question_type(question: str) -> tuple[str, str]:
    """(wh-word, head noun) of a question: ("which", "country"), ("how many", ""), ("", "") if none."""
    q = question.lower()
    for wh in _WH:
        m = re.search(rf"\b{wh}\b", q)
        if m:
            after = words(q[m.end() :])
            head = ""
            if wh in ("what", "which") and after and after[0] not in _STOP:
                head = after[0]
            return wh, head
    return "", ""


@dataclass
class _Candidate:
    text: str
    label: str
    count: int = 0
    first_rank: int = 99
    first_score: float = 0.0
    days_old: int = 0
    overlap: float = 0.0
    passages: set = field(default_factory=set)


def candidates(item: RankerItem) -> list[_Candidate]:
    """Entity candidates of an item, merged by normalised text, with the evidence features."""
    qwords = {w for w in words(item.question) if w not in _STOP}
    found: dict[str, _Candidate] = {}
    for p in item.passages:
        for m in p.mentions:
            key = normalize_answer(m.text)
            if not key:
                continue
            c = found.setdefault(key, _Candidate(m.text, m.label))
            c.count += 1
            c.passages.add(p.rank)
            if p.rank < c.first_rank:
                c.first_rank, c.first_score, c.days_old = p.rank, p.score, p.days_old
            sent = p.sentences[m.sentence] if m.sentence < len(p.sentences) else frozenset()
            if qwords:
                c.overlap = max(c.overlap, len(qwords & sent) / len(qwords))
    return list(found.values())


def features(item: RankerItem, c: _Candidate, wh: str, head: str, *, use_score: bool = True) -> dict[str, float]:
    """A candidate's feature row. `use_score=False` leaves the retrieval score out (a reader is given
    passages in rank order but not their scores, so a served ranker must not learn from them)."""
    qwords = set(words(item.question))
    cwords = words(c.text)
    in_question = bool(cwords) and all(w in qwords for w in cwords)
    row = {
        f"type={c.label}": 1.0,
        f"wh={wh}|type={c.label}": 1.0,
        f"head={head}|type={c.label}": 1.0 if head else 0.0,
        f"rank={min(c.first_rank, 5)}": 1.0,
        "inv_rank": 1.0 / (1 + c.first_rank),
        "score": c.first_score,
        "log_count": math.log1p(c.count),
        "passages_with": len(c.passages) / max(len(item.passages), 1),
        "overlap": c.overlap,
        f"overlap_bin={min(int(c.overlap * 4), 3)}": 1.0,
        "in_question": float(in_question),
        f"len={min(len(cwords), 5)}": 1.0,
        "log_days_old": math.log1p(max(c.days_old, 0)),
    }
    if not use_score:
        del row["score"]
    return row


def is_positive(candidate: str, answers: Sequence[str]) -> bool:
    return bool(exact_match(candidate, answers)) or token_f1(candidate, answers) >= POSITIVE_F1


class CandidateRanker:
    """fit(items) learns a logistic regression over candidate features; predict(items) gives answers.

    `use_score=False` learns without the retrieval score (what a served reader can see). A fitted
    ranker is plain JSON (`to_json`/`from_json`): the vocabulary, coefficients and intercept.

    Example:
        >>> ranker = CandidateRanker().fit(train_items)
        >>> ranker.predict(test_items)[:2]
        ['Denver Nuggets', '7']
    """

    def __init__(self, *, c: float = 1.0, seed: int = 0, use_score: bool = True) -> None:
        self.c, self.seed, self.use_score = c, seed, use_score
        self._vec = self._model = None

    def rows(self, item: RankerItem) -> tuple[list[_Candidate], list[dict[str, float]]]:
        """The item's candidates and their feature rows, in the same order."""
        wh, head = question_type(item.question)
        cands = candidates(item)
        return cands, [features(item, c, wh, head, use_score=self.use_score) for c in cands]

    def fit(self, items: Iterable[RankerItem]) -> CandidateRanker:
        from sklearn.feature_extraction import DictVectorizer  # noqa: PLC0415 (lazy: sklearn)
        from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 (lazy: sklearn)

        feats, labels = [], []
        for item in items:
            cands, rows = self.rows(item)
            feats.extend(rows)
            labels.extend(int(is_positive(c.text, item.answers)) for c in cands)
        if len(set(labels)) < 2:
            raise ValueError("the training items need candidates that match a gold answer and others that don't")
        self._vec = DictVectorizer()
        x = self._vec.fit_transform(feats)
        self._model = LogisticRegression(C=self.c, max_iter=2000, random_state=self.seed).fit(x, labels)
        return self

    def predict(self, items: Iterable[RankerItem]) -> list[str]:
        return [text for text, _ in self.predict_scored(items)]

    def predict_scored(self, items: Iterable[RankerItem]) -> list[tuple[str, float]]:
        """(best candidate, its probability) per item; ("", 0.0) for an item without candidates."""
        if self._model is None:
            raise RuntimeError("fit the ranker before predicting")
        out = []
        for item in items:
            cands, rows = self.rows(item)
            if not cands:
                out.append(("", 0.0))
                continue
            probs = self._model.predict_proba(self._vec.transform(rows))[:, 1]
            best = int(np.argmax(probs))
            out.append((cands[best].text, float(probs[best])))
        return out

    def to_json(self) -> dict:
        """The fitted ranker as JSON-able values (no pickle): settings, vocabulary, weights."""
        if self._model is None:
            raise RuntimeError("fit the ranker before saving it")
        return {
            "c": self.c,
            "seed": self.seed,
            "use_score": self.use_score,
            "vocabulary": list(self._vec.feature_names_),
            "classes": [int(k) for k in self._model.classes_],
            "coef": [float(w) for w in self._model.coef_[0]],
            "intercept": float(self._model.intercept_[0]),
        }

    @classmethod
    def from_json(cls, data: dict) -> CandidateRanker:
        """A ranker that predicts exactly as the one `to_json` wrote (the same arrays, the same code)."""
        from sklearn.feature_extraction import DictVectorizer  # noqa: PLC0415 (lazy: sklearn)
        from sklearn.linear_model import LogisticRegression  # noqa: PLC0415 (lazy: sklearn)

        names, coef = list(data["vocabulary"]), list(data["coef"])
        if len(names) != len(coef) or not names:
            raise ValueError(
                f"a saved ranker needs one coefficient per feature ({len(names)} features, {len(coef)} coefficients)"
            )
        ranker = cls(c=data.get("c", 1.0), seed=data.get("seed", 0), use_score=data.get("use_score", True))
        vec = DictVectorizer()
        vec.feature_names_, vec.vocabulary_ = names, {n: i for i, n in enumerate(names)}
        model = LogisticRegression(C=ranker.c, random_state=ranker.seed)
        model.classes_ = np.asarray(data.get("classes", [0, 1]))
        model.coef_ = np.asarray([coef], dtype=np.float64)
        model.intercept_ = np.asarray([data["intercept"]], dtype=np.float64)
        model.n_features_in_ = len(names)
        ranker._vec, ranker._model = vec, model
        return ranker


class MajorityAnswer:
    """The trivial baseline: always the most frequent gold answer of the training items."""

    def fit(self, items: Iterable[RankerItem]) -> MajorityAnswer:
        counts = Counter(normalize_answer(i.answers[0]) for i in items if i.answers)
        self.answer = counts.most_common(1)[0][0] if counts else ""
        return self

    def predict(self, items: Iterable[RankerItem]) -> list[str]:
        return [self.answer for _ in items]


def mean_f1(predictions: Sequence[str], items: Sequence[RankerItem]) -> float:
    """Mean token F1 in points (0..100)."""
    if not items:
        return math.nan
    return 100.0 * float(np.mean([token_f1(p, i.answers) for p, i in zip(predictions, items)]))
