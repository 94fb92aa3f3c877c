"""Fixtures of the benchmark tests over a loaded home."""

from __future__ import annotations

import pytest


@pytest.fixture
def served_env(loaded_settings, monkeypatch):
    """The environment `sqa serve` would read for the loaded home (the hash encoder, a fixed reader)."""
    monkeypatch.setenv("SQA_HOME", str(loaded_settings.home))
    monkeypatch.setenv("SQA_DATABASE_URL", loaded_settings.db_url)
    monkeypatch.setenv("SQA_ENCODER", "hash")
    monkeypatch.setenv("SQA_READER", "first-entity")
    return loaded_settings
