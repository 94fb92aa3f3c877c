"""A throw-away PostgreSQL database on a server: created empty, dropped after (tests, benchmarks)."""
from __future__ import annotations

import contextlib
import uuid
from typing import Iterator

from sqlalchemy import create_engine, make_url, text


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "sqa_test") -> Iterator[str]:
    """Create `<prefix>_<random>` on the server `server_url` points at; yield its URL; drop it (its
    connections ended first) when the block ends."""
    base = make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n AND pid <> pg_backend_pid()"),
                {"n": name})
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        admin.dispose()
