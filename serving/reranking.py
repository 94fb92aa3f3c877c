"""Evidence on top: a cross-encoder re-ranks the first stage's candidates, and which version serves.

Re-ranker versions are folders under SQA_HOME/rerankers (`sqa train reranker`, `models/reranker.py`);
the file `rerankers/ACTIVE` names the one that serves, written atomically by `activate_reranker`.
`RerankerState` follows that file (a stat per request at most every `poll_s`), loads a newly
activated version outside any lock, and swaps one reference, so a request keeps the model it took.

`RerankingRetriever` wraps a first-stage retriever (hybrid by default): it takes the first `depth`
candidates (published on or before as_of, like every retriever), scores each with the active
version, adds the first stage's score times the version's fitted weight, subtracts its fitted
recency prior (weight * log1p(age in days)), and keeps the top k (past `depth`, the first stage's
own order follows). With no active version it is the first stage itself.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.reranker import load_reranker
from serving.errors import NotFoundError

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from models.reader_base import RetrievedPassage
    from serving.index_state import LoadedSnapshot
    from serving.retrieval import Retriever

log = logging.getLogger(__name__)

ACTIVE_FILE = "ACTIVE"
INFO_FILE = "reranker.json"  # models.reranker.INFO_FILE (not imported: that module loads transformers)


def list_reranker_versions(rerankers_dir: Path) -> list[dict[str, Any]]:
    """The info of every version folder, oldest first, each with "active": bool."""
    active = active_reranker(rerankers_dir)
    out = []
    for info_path in sorted(Path(rerankers_dir).glob(f"*/{INFO_FILE}")):
        try:
            info = json.loads(info_path.read_text())
        except (OSError, ValueError):
            continue
        info.setdefault("version", info_path.parent.name)
        out.append({**info, "active": info["version"] == active})
    return sorted(out, key=lambda i: (str(i.get("created_at", "")), i["version"]))


def import_reranker(rerankers_dir: Path, folder: Path) -> dict[str, Any]:
    """Copy a version folder trained elsewhere (`python -m models.train_exported_reranker`) into
    `rerankers_dir` under its version name, after checking that it loads and scores; a folder that
    does not, or a name already there, is refused (ValueError) and nothing is written. Returns its info."""
    folder, rerankers_dir = Path(folder), Path(rerankers_dir)
    if not (folder / INFO_FILE).is_file():
        raise ValueError(
            f"{folder} is not a re-ranker version (no {INFO_FILE}): train one with "
            "`python -m models.train_exported_reranker EXPORT --out DIR`"
        )
    try:
        info: dict[str, Any] = json.loads((folder / INFO_FILE).read_text())
        version = str(info["version"])
        model = load_reranker(folder)
        if hasattr(model, "scores"):
            scores = model.scores("Who won?", ["A won.", "Rain."])
            if scores.shape != (2,) or not all(map(math.isfinite, scores.tolist())):
                raise ValueError(f"it scored a test pair {scores.tolist()}")
    except Exception as exc:  # a truncated copy raises safetensors' own error
        raise ValueError(f"{folder} does not load as a re-ranker version: {exc}") from exc
    if not version or "/" in version or version.startswith(".") or version == ACTIVE_FILE:
        raise ValueError(f"{folder}: {INFO_FILE} names version {version!r}, which cannot be a folder name")
    dest = rerankers_dir / version
    if dest.exists():
        raise ValueError(f"re-ranker version {version} is already in {rerankers_dir}")
    rerankers_dir.mkdir(parents=True, exist_ok=True)
    tmp = rerankers_dir / f".{version}.import.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    tmp.rename(dest)  # a crash mid-copy leaves only the hidden folder, which no listing reads
    return info


def active_reranker(rerankers_dir: Path) -> str | None:
    try:
        name = (Path(rerankers_dir) / ACTIVE_FILE).read_text().strip()
    except FileNotFoundError:
        return None
    return name or None


def activate_reranker(rerankers_dir: Path, version: str | None) -> None:
    """Make `version` the serving re-ranker (None: none serves). NotFoundError for an unknown one."""
    rerankers_dir = Path(rerankers_dir)
    if version is not None and not (rerankers_dir / version / INFO_FILE).exists():
        known = ", ".join(i["version"] for i in list_reranker_versions(rerankers_dir)) or "none yet"
        raise NotFoundError(f"no re-ranker version {version!r} (known: {known}; `sqa train reranker` makes one)")
    rerankers_dir.mkdir(parents=True, exist_ok=True)
    tmp = rerankers_dir / f".{ACTIVE_FILE}.{os.getpid()}.tmp"
    tmp.write_text((version or "") + "\n")
    os.replace(tmp, rerankers_dir / ACTIVE_FILE)


FOLLOW_ACTIVE = object()  # RerankerState's `pinned` default: serve what rerankers/ACTIVE names


class RerankerState:
    """The serving re-ranker model (or None), following rerankers/ACTIVE; or, `pinned` to a version
    name (None: no re-ranker), that version for good, whatever ACTIVE says (a benchmark's window
    answers with the version that served at its start)."""

    def __init__(
        self,
        rerankers_dir: Path,
        load: Callable[[Path], object],
        *,
        poll_s: float = 2.0,
        pinned: str | None | object = FOLLOW_ACTIVE,
    ) -> None:
        self.dir, self._load, self.poll_s = Path(rerankers_dir), load, poll_s
        if pinned is not FOLLOW_ACTIVE and pinned is not None and not (self.dir / str(pinned) / INFO_FILE).exists():
            raise NotFoundError(f"no re-ranker version {pinned!r} in {self.dir}")
        self._pinned = pinned
        self._model: object | None = None
        self._version: str | None = None
        self._checked = -math.inf
        self._lock = threading.Lock()

    def current(self) -> tuple[object | None, str | None]:
        """(model, version) serving now, (None, None) when no version is active."""
        now = time.monotonic()
        if now - self._checked >= self.poll_s:
            self._checked = now
            self.refresh()
        return self._model, self._version

    def refresh(self) -> bool:
        """Load the active version if it changed; True when the serving model changed. A version that
        fails to load is logged and the previous model keeps serving."""
        wanted = active_reranker(self.dir) if self._pinned is FOLLOW_ACTIVE else self._pinned
        assert wanted is None or isinstance(wanted, str)
        if wanted == self._version:
            return False
        if wanted is None:
            self._model, self._version = None, None
            return True
        if not self._lock.acquire(blocking=False):
            return False  # another request is loading it
        try:
            model = self._load(self.dir / wanted)
        except Exception as exc:  # keep serving what we have
            log.error("re-ranker version %s failed to load: %s", wanted, exc)
            return False
        finally:
            self._lock.release()
        self._model, self._version = model, wanted
        log.info("re-ranker %s serving", wanted)
        return True


def passage_input(title: str, text: str) -> str:
    """What the cross-encoder reads of a passage (training and serving alike)."""
    return f"{title}. {text}" if title else text


def candidate_of(p: RetrievedPassage, as_of: dt.date) -> dict[str, Any]:
    """What a re-ranker learns from and scores of one first-stage candidate (training and serving
    alike): its text as the cross-encoder reads it, its title, its age in days at `as_of`, the first
    stage's score and its article (models.ltr.candidate_features)."""
    return {
        "input": passage_input(p.title, p.dated_text),
        "title": p.title,
        "age": max(0, (as_of - p.published).days),
        "score": p.score,
        "article": p.article_id,
    }


class RerankingRetriever:
    """A first-stage retriever's top `depth` candidates re-ranked by the active cross-encoder version."""

    def __init__(self, base: Retriever, state: RerankerState, *, depth: int = 50) -> None:
        if depth < 1:
            raise ValueError(f"depth {depth} must be >= 1")
        self.base, self.state, self.depth = base, state, depth
        self.encoder = base.encoder

    @property
    def name(self) -> str:
        _, version = self.state.current()
        return f"{self.base.name}+{version}" if version else self.base.name

    def search(self, snapshot: LoadedSnapshot, question: str, as_of: dt.date, k: int) -> list[tuple[int, float]]:
        """The first stage's (faiss id, score) hits: re-ranking reads the passages (`retrieve`)."""
        return self.base.search(snapshot, question, as_of, k)

    def retrieve(
        self,
        session: Session,
        snapshot: LoadedSnapshot,
        question: str,
        as_of: dt.date,
        top_k: int,
        timings: dict[str, float] | None = None,
    ) -> list[RetrievedPassage]:
        model, _ = self.state.current()
        t0 = time.perf_counter()
        if model is None:
            return self.base.retrieve(session, snapshot, question, as_of, top_k)
        found = self.base.retrieve(session, snapshot, question, as_of, max(top_k, self.depth))
        t1 = time.perf_counter()
        # the first `depth` re-ranked, as the version learnt them; any asked for past them follow in
        # the first stage's order, so a deeper look (a benchmark's recall@50) sees the served top
        out = (rerank(model, question, as_of, found[: self.depth]) + found[self.depth :])[:top_k]
        if timings is not None:
            timings["first_stage"] = round((t1 - t0) * 1000, 2)
            timings["rerank"] = round((time.perf_counter() - t1) * 1000, 2)
        return out


def rerank(model: Any, question: str, as_of: dt.date, found: list[RetrievedPassage]) -> list[RetrievedPassage]:
    """`found` re-scored by `model`: its score (a cross-encoder's reading of each passage, or a
    feature model's, models.ltr), plus its weight times the first stage's score, minus its recency
    prior; best first."""
    if not found:
        return []
    if hasattr(model, "score_candidates"):  # a feature re-ranker reads the candidates as a list
        scores = model.score_candidates(question, [candidate_of(p, as_of) for p in found])
    else:
        scores = model.scores(question, [passage_input(p.title, p.dated_text) for p in found])
    weight = float(model.info.get("recency_weight", 0.0))
    first = float(model.info.get("first_stage_weight", 0.0))
    final = [
        float(s) + first * p.score - weight * math.log1p(max(0, (as_of - p.published).days))
        for s, p in zip(scores, found)
    ]
    order = sorted(range(len(found)), key=lambda i: -final[i])  # stable: ties keep the first stage's order
    return [replace(found[i], score=final[i]) for i in order]
