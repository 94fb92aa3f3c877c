"""Alembic environment: metadata from store, URL from the settings (or from the caller)."""

from __future__ import annotations

from alembic import context

from settings import get_settings
from store import tables  # noqa: F401  (registers the tables on Base.metadata)
from store.base import Base
from store.engine import make_engine

config = context.config
target_metadata = Base.metadata


def _include_name(name, type_, parent_names) -> bool:
    """APScheduler owns its job store table; Alembic leaves it alone."""
    return not (type_ == "table" and name == "apscheduler_jobs")


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    if not url:
        url = get_settings().db_url
    return url


def run_migrations_offline() -> None:
    context.configure(
        url=_url(),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
        include_name=_include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True, include_name=_include_name
        )
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    with engine.connect() as conn:
        context.configure(
            connection=conn, target_metadata=target_metadata, render_as_batch=True, include_name=_include_name
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
