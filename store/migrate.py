"""Apply Alembic migrations from code (start-up, `sqa db upgrade`, tests)."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config

# The migration scripts, found as package data (not imported: migrations/env.py sits above store).
MIGRATIONS_DIR = Path(str(files("migrations")))


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    cfg.attributes["url"] = url
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)
