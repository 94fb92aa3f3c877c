"""End to end with the real packaged models (MiniLM encoder, Gemma 3 270M reader), a real uvicorn server
and a real database: import -> ingest -> HTTP answers -> admin ingest swapping snapshots live."""

from __future__ import annotations

import concurrent.futures as cf
import os
import time

import httpx
import pytest

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config
from app.server_process import served
from indexer.importers import read_realtimeqa
from settings import Settings
from tests.conftest import POSTGRES_URL, SAMPLE, _postgres_database
from workers.imports import store_records
from workers.ingest import ingest

TOKEN = "integration-token"
pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def minilm():
    """The real MiniLM encoder, loaded once for both databases' ingests."""
    return build_encoder(Settings(encoder="minilm", env="test"))


def load_sample_with(settings: Settings, encoder, through: str) -> None:
    """conftest's `load_sample` (import the sample, ingest it through `through`) with a loaded encoder."""
    db = open_database(settings)
    try:
        articles, questions, _ = read_realtimeqa(SAMPLE)
        store_records(db.sessions, articles, questions)
        ingest(db.sessions, encoder, ingest_config(settings), {"through": through})
    finally:
        db.close()


@pytest.fixture(
    scope="module",
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.skipif(not POSTGRES_URL, reason="SQA_TEST_POSTGRES_URL is not set")),
    ],
)
def server(request, tmp_path_factory, gemma_cache, minilm):
    """A real `sqa serve` over the sample news ingested through 2024-02 with the real encoder, and
    zero-shot Gemma reading (the session's one conversion, linked in as the home's converted base)."""
    home = tmp_path_factory.mktemp("real") / "home"
    pg = None
    if request.param == "postgres":
        pg = _postgres_database()
        url = next(pg)
    else:
        url = f"sqlite:///{home / 'sqa.db'}"
    settings = Settings(home=home, database_url=url, encoder="minilm", reader="gemma", admin_token=TOKEN, env="test")
    load_sample_with(settings, minilm, through="2024-02")
    settings.models_dir.mkdir(parents=True, exist_ok=True)
    (settings.models_dir / "base").symlink_to(gemma_cache, target_is_directory=True)
    env = {
        **os.environ,
        "SQA_HOME": str(home),
        "SQA_DATABASE_URL": url,
        "SQA_ADMIN_TOKEN": TOKEN,
        "SQA_ENCODER": "minilm",
        "SQA_READER": "gemma",
        "SQA_SNAPSHOT_POLL_S": "1",
        "HF_HUB_OFFLINE": "1",
        "SQA_ANSWER_CONCURRENCY": "2",  # two questions at once during the swap: not the answer gate's test
        "SQA_AUTO_TRAIN": "false",  # the admin ingest alone (no re-ranker training after it), as in every other test
    }
    try:
        with served(env, home / "server.log") as running:
            yield running.base, settings
    finally:
        if pg is not None:
            pg.close()


def ask(base, question, as_of, top_k=5):
    r = httpx.post(f"{base}/v1/answers", json={"question": question, "as_of": as_of, "top_k": top_k}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_server_answers_with_real_models_and_dates(server):
    base, _ = server
    body = ask(base, "Who is the head coach of the Kestrel Bay Harriers?", "2024-01-24")
    assert body["versions"]["encoder"] == "all-MiniLM-L6-v2"
    assert body["versions"]["reader"].startswith("gemma")
    assert all(p["published"] <= "2024-01-24" for p in body["passages"])
    # MiniLM finds the coach's articles, and the reader answers with a short phrase.
    assert "Verhoeven" in body["passages"][0]["text"]
    assert body["answer"] and len(body["answer"].split()) <= 8


def test_server_admin_ingest_swaps_snapshot_while_serving(server):
    base, _ = server
    headers = {"X-Admin-Token": TOKEN}
    old = httpx.get(f"{base}/readyz").json()
    q = "Who is the mayor of Port Calder?"
    assert max(p["published"] for p in ask(base, q, "2024-03-31", 20)["passages"]) < "2024-03-01"
    r = httpx.post(f"{base}/admin/ingest", json={"month": "2024-03"}, headers=headers)
    assert r.status_code == 202, r.text
    job_url = f"{base}/admin/jobs/{r.json()['job_id']}"
    # Requests keep being answered while the ingest runs and the snapshot swaps.
    with cf.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda _: ask(base, q, "2024-03-31"), range(4)))
    assert all(res["passages"] for res in results)
    deadline = time.monotonic() + 300
    while (job := httpx.get(job_url, headers=headers).json())["state"] not in ("succeeded", "failed"):
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert job["state"] == "succeeded", job
    new = httpx.get(f"{base}/readyz").json()
    assert new["snapshot"] != old["snapshot"] and new["vectors"] > old["vectors"]
    late = ask(base, q, "2024-03-31", 20)
    assert max(p["published"] for p in late["passages"]) >= "2024-03-01"
    assert "Lindqvist" in " ".join(p["text"] for p in late["passages"])
