"""The "ranker" reader kind: the candidate ranker (models/candidates.py) served as a reader.

At answer time the passages it is given are annotated with the packaged spaCy (loaded once, on the
first question) and the best-scored entity is the answer. A reader is handed passages in rank
order but not their retrieval scores, so this kind learns without the score: `ranker_item` builds
the ranker's input from (question, as_of, passages, annotations) for training and serving alike,
and both annotate the passage body (date prefix left out) with `annotate_passages`.

A version folder holds `ranker.json`: the config, the DictVectorizer vocabulary, the coefficients
and the intercept (plain JSON, no pickle), beside `reader.json` (models/trained.py).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from models.candidates import CandidateRanker, RankerItem, annotate_passages, annotated
from models.reader_base import BatchedReader, Item, ReaderAnswer, RetrievedPassage
from models.saved_config import SavedConfig
from models.selflabel import load_nlp

RANKER_FILE = "ranker.json"


@dataclass(frozen=True)
class RankerConfig(SavedConfig):
    n_passages: int = 10  # passages read per question, in training and serving
    c: float = 1.0  # inverse L2 strength of the logistic regression
    seed: int = 0


def ranker_item(
    question: str,
    as_of: dt.date,
    records: Sequence[dict],
    published: Sequence[dt.date],
    *,
    qid: str = "",
    answers: Sequence[str] = (),
) -> RankerItem:
    """The ranker's input for one question: passage i has rank i, no retrieval score, and its age
    in days at `as_of`.

    Args:
        records: `annotate_passages` records of the passage bodies, in rank order.
        published: each passage's publication day, same order.
    Returns:
        a RankerItem (answers only matter in training).
    """
    if len(records) != len(published):
        raise ValueError(f"{len(records)} annotations for {len(published)} passages")
    return RankerItem(
        qid,
        question,
        tuple(answers),
        tuple(
            annotated(rec, rank=r, score=0.0, days_old=(as_of - day).days)
            for r, (rec, day) in enumerate(zip(records, published))
        ),
    )


def passage_bodies(passages: Sequence[RetrievedPassage]) -> list[str]:
    """What gets annotated: each passage's text without its date prefix (the title is left out)."""
    return [p.text for p in passages]


class RankerModel:
    """A fitted CandidateRanker and its config; `save`/`load` a version folder's `ranker.json`."""

    def __init__(self, ranker: CandidateRanker, config: RankerConfig) -> None:
        if ranker.use_score:
            raise ValueError("a served ranker must be fitted with use_score=False (readers get no retrieval scores)")
        self.ranker, self.config = ranker, config

    def save(self, path: Path | str) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        data = {"config": self.config.to_json(), "ranker": self.ranker.to_json()}
        tmp = path / (RANKER_FILE + ".tmp")
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(path / RANKER_FILE)

    @classmethod
    def load(cls, path: Path | str) -> RankerModel:
        path = Path(path)
        if not (path / RANKER_FILE).exists():
            raise FileNotFoundError(f"{path} is not a ranker reader folder ({RANKER_FILE} is missing)")
        data = json.loads((path / RANKER_FILE).read_text())
        return cls(CandidateRanker.from_json(data["ranker"]), RankerConfig.from_json(data.get("config", {})))


class CandidateReader(BatchedReader):
    """The `Reader` backend over a RankerModel: annotate the given passages, answer the top entity.

    Example:
        >>> reader = CandidateReader(RankerModel.load("models/ranker-2023-04-01-1a2b3c"))
        >>> reader.generate("Who won the NBA championship?", dt.date(2023, 6, 20), passages).text
        'Denver Nuggets'
    """

    def __init__(self, model: RankerModel, *, name: str = "ranker", n_passages: int | None = None, nlp=None) -> None:
        super().__init__(model, name=name, n_passages=n_passages)
        self._nlp = nlp
        self._lock = threading.Lock()  # spaCy pipelines are not documented as thread-safe

    def _annotate(self, bodies: list[str]) -> list[dict]:
        with self._lock:
            if self._nlp is None:
                self._nlp = load_nlp()
            return annotate_passages(self._nlp, bodies)

    def items(self, items: Sequence[Item]) -> list[RankerItem]:
        """The ranker's inputs for reader items (their first n_passages passages)."""
        cut = [(q, as_of, list(ps)[: self.n_passages]) for q, as_of, ps in items]
        records = iter(self._annotate([b for _, _, ps in cut for b in passage_bodies(ps)]))
        return [ranker_item(q, as_of, [next(records) for _ in ps], [p.published for p in ps]) for q, as_of, ps in cut]

    def _read(self, items: Sequence[Item]) -> list[ReaderAnswer]:
        return [
            ReaderAnswer(text=text, raw=f"{text}\t{prob:.3f}")
            for text, prob in self.model.ranker.predict_scored(self.items(items))
        ]
