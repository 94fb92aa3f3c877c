"""SQA_RETRIEVER through /v1/answers on the shipped sample: dense, bm25 and hybrid, the date filter
for each, and snapshots built before BM25 existed (a clear 503, then `sqa index bm25`)."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from tests.conftest import load_sample

QUESTIONS = [
    "Who is the mayor of Port Calder?",
    "Who is the head coach of the Kestrel Bay Harriers?",
    "What is the Calder Reserve Bank's benchmark interest rate?",
]


def ask(client, question: str, as_of: str, top_k: int = 10) -> dict:
    r = client.post("/v1/answers", json={"question": question, "as_of": as_of, "top_k": top_k})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("retriever", ["dense", "bm25", "hybrid"])
def test_answers_use_the_retriever_setting_and_its_date_filter(make_settings, database_url, retriever):
    settings = make_settings(database_url=database_url, retriever=retriever)
    load_sample(settings)
    with TestClient(create_app(settings)) as client:
        for as_of in ("2024-01-10", "2024-01-31", "2024-02-15", "2024-03-31"):
            for question in QUESTIONS:
                body = ask(client, question, as_of)
                assert body["versions"]["retriever"] == retriever
                published = [p["published"] for p in body["passages"]]
                assert published and max(published) <= as_of
        body = ask(client, "Kestrel Bay Harriers head coach", "2024-03-31", top_k=3)
        if retriever == "bm25":  # every BM25 hit shares a word with the question
            assert all(
                {"kestrel", "harriers", "coach"} & set(p["text"].lower().replace(".", " ").split())
                for p in body["passages"]
            )


def test_answers_hybrid_fuses_dense_and_bm25_rankings(make_settings):
    """The hybrid ranking is the RRF of the dense and the BM25 rankings of the same request."""
    import datetime as dt

    from indexer.fusion import reciprocal_rank_fusion
    from indexer.ids import id_seq
    from serving.retrieval import Bm25Retriever

    settings = make_settings(retriever="hybrid", fusion="rrf")
    load_sample(settings)
    with TestClient(create_app(settings)) as client:
        service = client.app.state.answers
        snapshot = service.index_state.current()
        as_of = dt.date(2024, 3, 14)
        q = QUESTIONS[1]
        dense = service.retriever.base.dense.search(snapshot, q, as_of, 50)  # under the (idle) re-ranking stage
        bm25 = Bm25Retriever(service.retriever.encoder).search(snapshot, q, as_of, 50)
        expected = reciprocal_rank_fusion([[i for i, _ in dense], [i for i, _ in bm25]], 5)
        body = ask(client, q, "2024-03-14", top_k=5)
        assert [p["passage_id"] for p in body["passages"]] == [id_seq(i) for i, _ in expected]
        assert [p["score"] for p in body["passages"]] == pytest.approx([s for _, s in expected])
        assert {i for i, _ in dense[:5]} != {i for i, _ in bm25[:5]}  # the fusion had something to do


def test_answers_bm25_without_bm25_files_is_a_clear_503_until_sqa_index_bm25(make_settings, monkeypatch, sqa):
    """A snapshot built before BM25 existed: dense serves, bm25 says what to run, and after it, serves."""
    import workers.ingest as ingest_module
    from indexer.snapshot import write_shard

    settings = make_settings(retriever="bm25")
    with monkeypatch.context() as patch:  # ingest as before BM25 existed: FAISS shards only
        patch.setattr(
            ingest_module,
            "write_shard",
            lambda index_dir, shard, lexical=None, **kw: write_shard(index_dir, shard, **kw),
        )
        load_sample(settings)
    with TestClient(create_app(make_settings(retriever="dense"))) as dense_client:
        ask(dense_client, QUESTIONS[0], "2024-02-15")
    with TestClient(create_app(settings)) as client:
        r = client.post("/v1/answers", json={"question": QUESTIONS[0], "as_of": "2024-02-15"})
        assert r.status_code == 503
        assert "2024-01, 2024-02, 2024-03" in r.json()["detail"] and "sqa index bm25" in r.json()["detail"]
        out = sqa("index", "bm25")
        assert out.exit_code == 0, out.output
        assert "BM25 for 2024-01, 2024-02, 2024-03" in out.output
        assert "already has its BM25 index" in sqa("index", "bm25").output
        client.app.state.answers.index_state.refresh()  # what the snapshot poll does
        body = ask(client, QUESTIONS[0], "2024-02-15")
        assert body["passages"] and max(p["published"] for p in body["passages"]) <= "2024-02-15"
    status = sqa("index", "status")
    assert status.exit_code == 0 and "no BM25" not in status.output
