"""The server refuses an index whose files disagree with the database, and says how to rebuild."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.bootstrap.builders import open_database
from app.main import create_app
from indexer.index_errors import IndexIntegrityError
from serving.index_state import latest_snapshot_row

ROOT = Path(__file__).resolve().parents[2]


def newest_manifest(settings) -> Path:
    db = open_database(settings, migrate=False)
    with db.sessions() as s:
        path = settings.index_dir / latest_snapshot_row(s).manifest_file
    db.close()
    return path


def cli(settings, *args):
    env = {
        "PATH": "/usr/bin:/bin",
        "SQA_HOME": str(settings.home),
        "SQA_DATABASE_URL": settings.db_url,
        "SQA_ENCODER": settings.encoder,
        "SQA_READER": settings.reader,
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def test_server_refuses_a_corrupt_shard_and_rebuild_fixes_it(loaded_settings):
    shard = sorted((loaded_settings.index_dir / "shards").glob("2024-02.*.faiss"))[-1]
    shard.write_bytes(shard.read_bytes()[:-16] + b"\0" * 16)
    with pytest.raises(IndexIntegrityError, match="sqa index rebuild"):
        with TestClient(create_app(loaded_settings)):
            pass
    status = cli(loaded_settings, "index", "status")
    assert status.returncode != 0 and "sqa index rebuild" in status.stderr
    rebuilt = cli(loaded_settings, "index", "rebuild")
    assert rebuilt.returncode == 0, rebuilt.stderr
    with TestClient(create_app(loaded_settings)) as c:
        ready = c.get("/readyz").json()
        assert ready["ready"] is True and ready["vectors"] == 72


def test_server_refuses_an_edited_manifest(loaded_settings):
    path = newest_manifest(loaded_settings)
    path.write_text(path.read_text().replace('"count": 24', '"count": 23', 1))
    with pytest.raises(IndexIntegrityError, match="checksum"):
        with TestClient(create_app(loaded_settings)):
            pass


def test_server_refuses_a_missing_manifest(loaded_settings):
    newest_manifest(loaded_settings).unlink()
    with pytest.raises(IndexIntegrityError, match="missing"):
        with TestClient(create_app(loaded_settings)):
            pass


def test_server_refuses_an_index_built_with_another_encoder(loaded_settings, make_settings):
    other = make_settings(database_url=loaded_settings.database_url, encoder="hash:dim=128")
    with pytest.raises(IndexIntegrityError, match="encoder"):
        with TestClient(create_app(other)):
            pass
