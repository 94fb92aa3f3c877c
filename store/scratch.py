"""A throw-away PostgreSQL database on a server: created empty, dropped after (tests, benchmarks)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import create_engine, make_url, text


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "sqa_test") -> Iterator[str]:
    """Create `<prefix>_<random>` on the server `server_url` points at; yield its URL; drop it (its
    connections ended first; PostgreSQL 13 or later) when the block ends."""
    base = make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            # FORCE (PostgreSQL 13+) ends the database's sessions and waits for them to go before it
            # drops; pg_terminate_backend alone only signals them, and a DROP right after could race.
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
