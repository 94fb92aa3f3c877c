"""Opening the database skips Alembic when the schema is already the newest, and only then."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import inspect

from store.engine import head_revisions, make_engine, open_database, schema_is_current

pytestmark = pytest.mark.integration


def test_head_revisions_are_alembics_heads():
    from alembic.script import ScriptDirectory

    from store.migrate import alembic_config

    assert head_revisions() == frozenset(ScriptDirectory.from_config(alembic_config("sqlite://")).get_heads())


def test_an_old_or_new_schema_is_migrated_and_a_current_one_left_alone(database_url, monkeypatch):
    from alembic import command

    from store import migrate
    from store.migrate import alembic_config

    if database_url.startswith("sqlite:///"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    engine = make_engine(database_url)
    try:
        assert not schema_is_current(engine)  # a new database: no alembic_version table
        open_database(database_url).close()
        assert schema_is_current(engine) and "month_drift" in inspect(engine).get_table_names()

        command.downgrade(alembic_config(database_url), "0003")
        assert not schema_is_current(engine)
        open_database(database_url).close()  # behind: upgraded again
        assert schema_is_current(engine) and "month_drift" in inspect(engine).get_table_names()

        def refuse(url, revision="head"):
            raise AssertionError("Alembic ran on a current schema")

        monkeypatch.setattr(migrate, "upgrade", refuse)
        open_database(database_url).close()  # current: Alembic is not asked
    finally:
        engine.dispose()


def test_the_migrated_schema_is_the_one_the_tables_declare(database_url):
    """A column added to store/tables.py without its migration (or the other way round) fails here."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from store.base import Base

    if database_url.startswith("sqlite:///"):
        Path(database_url.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    open_database(database_url).close()
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        assert diff == []
        columns = {c["name"] for c in inspect(engine).get_columns("eval_results")}
        assert {"grounded", "confidence"} <= columns
    finally:
        engine.dispose()
