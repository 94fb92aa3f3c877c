"""End to end: an article pushed over HTTP, published by the worker's live loop (not by the request),
is cited by an answer as of its day once the server picks up the new snapshot."""

from __future__ import annotations

import datetime as dt
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.bootstrap.builders import build_encoder, open_database
from app.bootstrap.job_configs import ingest_config, live_config
from app.main import create_app
from indexer.records import ArticleRecord
from store.intake import intake_articles
from store.tables import LiveQueueItem
from tests.conftest import load_sample
from workers.live_publisher import LivePublisher

ROOT = Path(__file__).resolve().parents[2]
ADMIN = {"X-Admin-Token": "test-admin-token"}
ARTICLE = {
    "url": "https://wire.example/beacon",
    "title": "Beacon back",
    "published": "2024-03-29",
    "source": "wire",
    "text": "Keeper Ilse Varga relit the Skerry beacon on Friday night.",
}


def test_pushed_article_is_cited_after_the_live_loop_publishes_it(make_settings):
    settings = make_settings(snapshot_poll_s=0.2, live_max_wait_s=0.1, live_poll_s=0.1)
    load_sample(settings)
    db = open_database(settings)
    publisher = LivePublisher(
        db.sessions, lambda: build_encoder(settings), ingest_config(settings), live_config(settings)
    )
    loop = threading.Thread(target=publisher.run, daemon=True)
    try:
        with TestClient(create_app(settings)) as client:
            assert client.post("/admin/articles", json=[ARTICLE], headers=ADMIN).json()["new"] == 1
            loop.start()
            question = {"question": "Who relit the Skerry beacon?", "as_of": "2024-03-29"}
            cited = False
            for _ in range(300):  # bounded: the loop publishes within a poll, the server swaps within its poll
                answer = client.post("/v1/answers", json=question)
                assert answer.status_code == 200, answer.text
                if any(p["url"] == ARTICLE["url"] for p in answer.json()["passages"]):
                    cited = True
                    break
                time.sleep(0.1)
            assert cited, publisher.last_error
            assert publisher.last["articles"] == 1
            assert client.get("/admin/live", headers=ADMIN).json()["waiting"] == 0
    finally:
        publisher.stop()
        if loop.is_alive():
            loop.join(timeout=30)
        db.close()


def test_sqa_worker_publishes_the_live_queue_and_stops_on_sigterm(make_settings, tmp_path):
    settings = make_settings()
    load_sample(settings)
    db = open_database(settings)
    with db.sessions() as s, s.begin():
        intake_articles(
            s, [ArticleRecord(ARTICLE["url"], ARTICLE["title"], ARTICLE["text"], dt.date(2024, 3, 29), "wire")]
        )
    env = {k: v for k, v in os.environ.items() if not k.startswith("SQA_")}
    env.update(
        SQA_HOME=str(settings.home),
        SQA_ENV="test",
        SQA_ENCODER="hash",
        SQA_READER="first-entity",
        SQA_INGEST_CRON="0 0 1 1 *",
        SQA_EVAL_CRON="0 0 2 1 *",
        SQA_LIVE_MAX_WAIT_S="0",
        SQA_LIVE_POLL_S="0.1",
        SQA_AUTO_TRAIN="false",
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "worker"], cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True
    )
    lines: list[str] = []
    try:
        for _ in range(2000):  # bounded by lines read: the worker logs each publish
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "live publish:" in line:
                break
        assert any("live publish: 1 articles" in x for x in lines), "".join(lines)
        with db.sessions() as s:
            assert s.scalar(select(func.count()).select_from(LiveQueueItem)) == 0
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
        db.close()
    assert proc.returncode == 0, "".join(lines) + rest
    assert "worker stopped" in rest
