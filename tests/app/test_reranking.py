"""Re-ranking (serving/reranking.py): the version registry (ACTIVE file), the state that follows
it, and the re-ranking retriever over the sample index (order, the date filter, timings)."""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pytest

from app.bootstrap.builders import build_answer_service, build_encoder, open_database
from serving.errors import NotFoundError
from serving.reranking import (
    INFO_FILE,
    RerankerState,
    RerankingRetriever,
    activate_reranker,
    active_reranker,
    list_reranker_versions,
    rerank,
)
from serving.retrieval import make_retriever


class ReversingModel:
    """Scores candidates in the reverse of the first stage's order (the last one best)."""

    def __init__(self, recency_weight: float = 0.0, first_stage_weight: float = 0.0) -> None:
        self.info = {"recency_weight": recency_weight, "first_stage_weight": first_stage_weight}
        self.calls = 0

    def scores(self, query, passages):
        self.calls += 1
        return np.arange(len(passages), dtype=np.float32)


def _version(root, name, **info):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / INFO_FILE).write_text(json.dumps({"version": name, **info}))


def test_activate_list_and_refuse_an_unknown_version(tmp_path):
    root = tmp_path / "rerankers"
    assert active_reranker(root) is None and list_reranker_versions(root) == []
    _version(root, "reranker-a", created_at="2024-01-01", validation={"recall@5": 50.0})
    _version(root, "reranker-b", created_at="2024-02-01")
    activate_reranker(root, "reranker-b")
    assert active_reranker(root) == "reranker-b"
    assert [(i["version"], i["active"]) for i in list_reranker_versions(root)] == [
        ("reranker-a", False),
        ("reranker-b", True),
    ]
    with pytest.raises(NotFoundError, match="no re-ranker version 'nope' .known: reranker-a, reranker-b"):
        activate_reranker(root, "nope")
    assert active_reranker(root) == "reranker-b"  # unchanged by the refusal
    activate_reranker(root, None)
    assert active_reranker(root) is None


def test_state_follows_the_active_file_and_keeps_serving_when_a_version_fails_to_load(tmp_path):
    root = tmp_path / "rerankers"
    _version(root, "good")
    _version(root, "broken")
    loaded = []

    def load(folder):
        if folder.name == "broken":
            raise OSError("weights missing")
        loaded.append(folder.name)
        return ReversingModel()

    state = RerankerState(root, load, poll_s=0)
    assert state.current() == (None, None)
    activate_reranker(root, "good")
    model, version = state.current()
    assert version == "good" and isinstance(model, ReversingModel) and loaded == ["good"]
    activate_reranker(root, "broken")
    assert state.current() == (model, "good")  # the failed load leaves the previous model serving
    activate_reranker(root, None)
    assert state.current() == (None, None)


def test_rerank_applies_the_recency_prior_of_the_version():
    from models.reader_base import RetrievedPassage

    as_of = dt.date(2024, 3, 10)
    old = RetrievedPassage("Old", "old text", dt.date(2024, 1, 10), 1, 1, 1, "u1", 0.9)
    new = RetrievedPassage("New", "new text", dt.date(2024, 3, 9), 2, 2, 2, "u2", 0.8)
    # the model prefers `new` (the later candidate) by 1.0; a heavy prior cannot reverse that here...
    assert [p.passage_id for p in rerank(ReversingModel(0.0), "q", as_of, [old, new])] == [2, 1]
    # ...and with the order reversed, the prior on a 60-day-old passage (log1p(60) ~ 4.1) moves `new` up
    assert [p.passage_id for p in rerank(ReversingModel(1.0), "q", as_of, [new, old])] == [2, 1]
    assert [p.passage_id for p in rerank(ReversingModel(0.0), "q", as_of, [new, old])] == [1, 2]


def test_reranking_retriever_reorders_the_first_stage_within_the_date_filter(loaded_settings):
    db = open_database(loaded_settings)
    try:
        service = build_answer_service(loaded_settings, db, build_encoder(loaded_settings))
        service.index_state.refresh()
        snap = service.index_state.current()
        first = make_retriever("hybrid", service.retriever.encoder)
        model = ReversingModel()
        state = RerankerState(loaded_settings.rerankers_dir, lambda folder: model, poll_s=0)
        retriever = RerankingRetriever(first, state, depth=8)
        as_of = dt.date(2024, 2, 15)
        question = "Who won the harbour regatta?"
        with db.sessions() as session:
            base = first.retrieve(session, snap, question, as_of, 8)
            plain = retriever.retrieve(session, snap, question, as_of, 3)  # no active version: the first stage
            assert [p.passage_id for p in plain] == [p.passage_id for p in base[:3]] and model.calls == 0
            _version(loaded_settings.rerankers_dir, "reranker-x")
            activate_reranker(loaded_settings.rerankers_dir, "reranker-x")
            timings = {}
            ranked = retriever.retrieve(session, snap, question, as_of, 3, timings=timings)
        assert model.calls == 1 and retriever.name == "hybrid+reranker-x"
        assert [p.passage_id for p in ranked] == [p.passage_id for p in reversed(base)][:3]
        assert all(p.published <= as_of for p in ranked)
        assert set(timings) == {"first_stage", "rerank"}
        # asked for more than its depth, a re-ranker re-orders its depth and the rest follows in the
        # first stage's order: a deeper look (a benchmark's recall@50) sees the served top
        with db.sessions() as session:
            deeper = RerankingRetriever(first, state, depth=3).retrieve(session, snap, question, as_of, 6)
        ids = [p.passage_id for p in base]
        assert len(ids) >= 6 and [p.passage_id for p in deeper] == ids[:3][::-1] + ids[3:6]
    finally:
        db.close()


def test_the_served_answer_reports_the_rerank_time(loaded_settings):
    """With a version active, the service's timings split retrieval from re-ranking."""
    _version(loaded_settings.rerankers_dir, "reranker-y")
    activate_reranker(loaded_settings.rerankers_dir, "reranker-y")
    settings = loaded_settings.model_copy(update={"reranker": "auto"})
    db = open_database(settings)
    try:
        service = build_answer_service(settings, db, build_encoder(settings))
        service.retriever.state._load = lambda folder: ReversingModel()
        service.index_state.refresh()
        result = service.answer("Who won the harbour regatta?", dt.date(2024, 2, 15))
        assert {"retrieve", "rerank", "read", "total"} <= set(result.timings_ms)
        assert result.versions["retriever"] == "hybrid+reranker-y"
        assert all(p.published <= dt.date(2024, 2, 15) for p in result.passages)
    finally:
        db.close()


def test_rerank_adds_the_first_stage_score_by_the_version_weight():
    from models.reader_base import RetrievedPassage

    day = dt.date(2024, 3, 10)
    strong = RetrievedPassage("A", "a", day, 1, 1, 1, "u1", 1.0)  # the first stage's best
    weak = RetrievedPassage("B", "b", day, 2, 2, 2, "u2", 0.0)
    # the model alone prefers the later candidate by 1.0; a first-stage weight of 2 outweighs it
    assert [p.passage_id for p in rerank(ReversingModel(), "q", day, [strong, weak])] == [2, 1]
    ranked = rerank(ReversingModel(first_stage_weight=2.0), "q", day, [strong, weak])
    assert [p.passage_id for p in ranked] == [1, 2] and ranked[0].score == pytest.approx(0.0 + 2.0 * 1.0)


def test_reranker_state_pinned_serves_its_version_whatever_active_says(tmp_path):
    root = tmp_path / "rerankers"
    _version(root, "old")
    _version(root, "new")
    activate_reranker(root, "new")
    loaded = []

    def load(folder):
        loaded.append(folder.name)
        return ReversingModel()

    pinned = RerankerState(root, load, poll_s=0, pinned="old")
    assert pinned.current()[1] == "old" and loaded == ["old"]
    activate_reranker(root, None)
    assert pinned.current()[1] == "old" and loaded == ["old"]  # ACTIVE changed: the pin holds, no reload
    none = RerankerState(root, load, poll_s=0, pinned=None)
    activate_reranker(root, "new")
    assert none.current() == (None, None)  # pinned to no re-ranker, even with one active
    with pytest.raises(NotFoundError, match="no re-ranker version 'gone'"):
        RerankerState(root, load, pinned="gone")


def test_build_retriever_pins_a_version_or_none(loaded_settings):
    from app.bootstrap.builders import build_retriever

    settings = loaded_settings.model_copy(update={"reranker": "auto"})
    _version(settings.rerankers_dir, "old")
    _version(settings.rerankers_dir, "new")
    activate_reranker(settings.rerankers_dir, "new")
    encoder = build_encoder(settings)
    assert isinstance(build_retriever(settings, encoder), RerankingRetriever)
    assert not isinstance(build_retriever(settings, encoder, reranker=None), RerankingRetriever)
    pinned = build_retriever(settings, encoder, reranker="old")
    assert isinstance(pinned, RerankingRetriever) and pinned.state._pinned == "old"
    with pytest.raises(NotFoundError, match="no re-ranker version 'gone'"):
        build_retriever(settings, encoder, reranker="gone")
