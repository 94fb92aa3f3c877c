"""The time filter on real data: RealTimeQA's search ran after each question, so some of a question's
own search results were published after it. None of them may come back for that question."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from app.bootstrap.builders import build_answer_service, build_encoder, build_reader, open_database
from app.bootstrap.job_configs import ingest_config
from indexer.importers import read_realtimeqa
from workers.imports import store_records
from workers.ingest import ingest

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "realtimeqa"

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not DATA.exists(), reason=f"the RealTimeQA slice is not at {DATA}"),
]


def test_future_search_results_never_reach_their_question(sqlite_settings):
    articles, questions, _ = read_realtimeqa(DATA)
    by_url = {a.url: a for a in articles}
    window = [q for q in questions if dt.date(2023, 4, 1) <= q.asked <= dt.date(2023, 6, 30)]
    late = {
        q.qid: [u for u in q.meta["search_result_urls"] if u in by_url and by_url[u].published > q.asked]
        for q in window
    }
    late = {qid: urls for qid, urls in late.items() if urls}
    assert len(late) >= 5, "the slice should hold questions whose search results postdate them"
    # The articles of the questions that have later results: their earlier results compete with the
    # later ones (the index holds a few hundred articles, not the quarter's thousands).
    wanted = {u for q in window if q.qid in late for u in q.meta["search_result_urls"] if u in by_url}
    subset = [by_url[u] for u in sorted(wanted)]

    settings = sqlite_settings
    db = open_database(settings)
    store_records(db.sessions, subset, [q for q in window if q.qid in late])
    ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": "2023-12", "from": "2023-04"})
    service = build_answer_service(settings, db, build_encoder(settings), build_reader(settings))
    service.index_state.refresh()

    qs = {q.qid: q for q in window}
    seen_without_filter = 0
    for qid, urls in late.items():
        q = qs[qid]
        result = service.answer(q.text, q.asked, top_k=50)
        assert all(p.published <= q.asked for p in result.passages)
        assert not set(urls) & {p.url for p in result.passages}, f"{qid}: a later article was retrieved"
        # Control: without the date bound the same later articles are retrievable, so the filter did work.
        unbounded = service.answer(q.text, dt.date(2030, 1, 1), top_k=50, read=False)  # retrieval is the control
        seen_without_filter += bool(set(urls) & {p.url for p in unbounded.passages})
    db.close()
    print(
        f"{len(late)} questions have {sum(map(len, late.values()))} later search results; "
        f"{seen_without_filter} of them retrieve one when unfiltered, none when filtered"
    )
    assert seen_without_filter >= 5  # (hash encoder: lexical overlap only, so not every one ranks)
