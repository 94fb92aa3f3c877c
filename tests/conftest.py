"""Shared fixtures: a fresh SQA_HOME per test, SQLite always and PostgreSQL when
SQA_TEST_POSTGRES_URL is set, the shipped sample news, and settings with the fast fakes (no real
model: tests that load one are marked `integration` and load it themselves)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from settings import Settings
from store.scratch import scratch_database
from tests.feed_server import feed_server  # noqa: F401  (the fixture of the feed tests: RSS and Atom served from 127.0.0.1)

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "indexer" / "sample" / "realtimeqa"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
POSTGRES_URL = os.environ.get("SQA_TEST_POSTGRES_URL", "")

# Tests never wait on a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def sample_root() -> Path:
    return SAMPLE


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


def _postgres_database():
    """Create a throw-away database on the PostgreSQL server; yields its URL, drops it after."""
    with scratch_database(POSTGRES_URL) as url:
        yield url


DB_PARAMS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param(
        "postgres",
        id="postgres",
        marks=[pytest.mark.postgres, pytest.mark.skipif(not POSTGRES_URL, reason="SQA_TEST_POSTGRES_URL is not set")],
    ),
]


@pytest.fixture(params=DB_PARAMS)
def database_url(request, tmp_path):
    """Run the test once on SQLite and once on PostgreSQL (when configured)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'home' / 'sqa.db'}"
    else:
        yield from _postgres_database()


@pytest.fixture
def make_settings(tmp_path):
    """Settings for a fresh SQA_HOME with the fast fakes (hash encoder, first-entity reader)."""

    def make(**overrides) -> Settings:
        values = dict(
            home=tmp_path / "home",
            encoder="hash",
            reader="first-entity",
            env="test",
            snapshot_poll_s=0,
            admin_token="test-admin-token",
            auto_train=False,
        )
        values.update(overrides)
        return Settings(**values)

    return make


@pytest.fixture
def settings(make_settings, database_url) -> Settings:
    return make_settings(database_url=database_url)


@pytest.fixture
def sqlite_settings(make_settings) -> Settings:
    return make_settings()


@pytest.fixture
def production_settings(make_settings):
    """Settings on PostgreSQL when SQA_TEST_POSTGRES_URL is set (the production database), else
    SQLite: for the slow tests (a minute or more) that run once, on the database that matters
    most; what they store is covered on both by faster tests."""
    if not POSTGRES_URL:
        yield make_settings()
        return
    with scratch_database(POSTGRES_URL) as url:
        yield make_settings(database_url=url)


def load_sample(settings: Settings, through: str = "2024-03", since=None, until=None):
    """Import the shipped sample and ingest it through `through`; returns the last ingest job."""
    from app.bootstrap.builders import build_encoder, open_database
    from app.bootstrap.job_configs import ingest_config
    from indexer.importers import read_realtimeqa
    from workers.imports import store_records
    from workers.ingest import ingest

    db = open_database(settings)
    try:
        articles, questions, _ = read_realtimeqa(SAMPLE, since=since, until=until)
        store_records(db.sessions, articles, questions)
        return ingest(db.sessions, build_encoder(settings), ingest_config(settings), {"through": through})
    finally:
        db.close()


@pytest.fixture
def loaded_settings(settings) -> Settings:
    """Settings whose home holds the sample news, ingested through 2024-03 (three month shards)."""
    load_sample(settings)
    return settings


@pytest.fixture
def loaded_production_settings(production_settings) -> Settings:
    """`production_settings` with the sample news ingested through 2024-03 (the slow tests' one run)."""
    load_sample(production_settings)
    return production_settings


@pytest.fixture
def client(loaded_settings):
    """A TestClient over the app with the sample loaded (lifespan runs)."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app(loaded_settings)) as c:
        yield c


@pytest.fixture
def sqa(monkeypatch, tmp_path):
    """Run `sqa ARGS...` in this process over a fresh SQA_HOME (tmp_path/home) with the fast fakes;
    returns click's Result (exit_code, output)."""
    from typer.testing import CliRunner

    from app.cli import cli
    from settings import get_settings

    monkeypatch.setenv("SQA_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("SQA_ENCODER", "hash")
    monkeypatch.setenv("SQA_READER", "first-entity")
    monkeypatch.setenv("SQA_AUTO_TRAIN", "false")  # tests/workers/test_auto_train.py turns it on
    monkeypatch.delenv("SQA_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    runner = CliRunner()
    yield lambda *args: runner.invoke(cli, list(args))
    get_settings.cache_clear()


@pytest.fixture
def wait_job():
    """A function that polls GET /admin/jobs/{id} until the job ends (or fails the test after `timeout` s)."""
    import time

    def wait(client, job_id, timeout=60.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = client.get(f"/admin/jobs/{job_id}", headers={"X-Admin-Token": "test-admin-token"}).json()
            if job["state"] in ("succeeded", "failed", "interrupted"):
                return job
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} did not finish: {job}")

    return wait


@pytest.fixture(scope="session")
def gemma_cache(tmp_path_factory):
    """A cache dir holding the converted Gemma 3 270M (models.gemma_weights.gemma_folder), shared by the
    session's tests: the folder SQA_TEST_GEMMA_CACHE names, or else the user's default cache
    (~/.cache/sqa/gemma3-270m), when it holds a converted model (read only, saves the conversion). Else
    the one GGUF conversion (about 40 s on a busy CPU) goes into that user cache, as `make demo`'s first
    run would (written atomically by gemma_folder), so the next run reuses it; into the run's temporary
    folder where the user cache is not writable. Under pytest-xdist the workers share it: the first
    converts, the others wait on a file lock and reuse it."""
    from filelock import FileLock

    from models.gemma_weights import DEFAULT_CACHE_DIR, FOLDER_NAME, gemma_folder

    for given in (os.environ.get("SQA_TEST_GEMMA_CACHE", ""), str(DEFAULT_CACHE_DIR.expanduser())):
        if given and (Path(given) / FOLDER_NAME / "model.safetensors").exists():
            return Path(given)
    user = DEFAULT_CACHE_DIR.expanduser()
    try:
        user.mkdir(parents=True, exist_ok=True)
        with FileLock(str(user.parent / ".gemma-cache.lock")):
            gemma_folder(user)
        return user
    except OSError:  # no writable home: convert for this run only
        pass
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    cache = shared / "gemma-cache"
    with FileLock(str(shared / "gemma-cache.lock")):
        gemma_folder(cache)
    return cache


@pytest.fixture(scope="session")
def tiny_gemma_cache(tmp_path_factory) -> Path:
    """A cache dir holding a tiny random Gemma 3 and a small tokenizer as the converted base
    (tests/tiny_models.py): for the tests of what a job does around the model. Read only: a test
    symlinks it as `$SQA_HOME/models/base` or passes it as a `cache_dir`."""
    from tests.tiny_models import write_tiny_gemma

    return write_tiny_gemma(tmp_path_factory.mktemp("tiny-gemma"))


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    """A folder holding a tiny random BERT with the packaged MiniLM's tokenizer (tests/tiny_models.py),
    to warm start FiD and the extractive reader from. Read only."""
    from tests.tiny_models import write_tiny_bert

    return write_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture
def tiny_minilm(monkeypatch, tiny_bert) -> Path:
    """`models.encoders.packaged_minilm_path` returns `tiny_bert`: what warm-starts from the packaged
    MiniLM (the extractive reader, FiD's minilm backbone) starts from the tiny BERT instead."""
    import models.encoders

    monkeypatch.setattr(models.encoders, "packaged_minilm_path", lambda: tiny_bert)
    return tiny_bert
