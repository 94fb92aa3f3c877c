"""`loaded_settings` built once: the sample news ingested through 2024-03 (conftest's `load_sample`)
into a template home per database kind, once per test process, then copied into each test's own
home and database (files copied; PostgreSQL: `CREATE DATABASE ... TEMPLATE`). A test gets the same
home it would get by ingesting the sample itself, in milliseconds instead of seconds.

A test module opts in by importing the fixture, which overrides conftest's of the same name there
(and so for the fixtures built on it, such as `client`):

    from tests.loaded import loaded_settings  # noqa: F401  (the copied sample: overrides conftest's)

Only for modules whose `settings` is conftest's (the template is built with its values).
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, make_url, text

from settings import Settings
from tests.conftest import POSTGRES_URL, load_sample


class _Templates:
    """kind ("sqlite" or "postgres") -> (template home, template database name or None), built on first use."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.built: dict[str, tuple[Path, str | None]] = {}

    def get(self, kind: str, like: Settings) -> tuple[Path, str | None]:
        if kind not in self.built:
            home = self.root / kind / "home"
            name = None
            if kind == "sqlite":
                url = f"sqlite:///{home / 'sqa.db'}"
            else:
                name = f"sqa_template_{uuid.uuid4().hex[:12]}"
                self._admin(f'CREATE DATABASE "{name}"')
                url = make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
            load_sample(like.model_copy(update={"home": home, "database_url": url}))  # closes its database
            self.built[kind] = (home, name)
        return self.built[kind]

    def close(self) -> None:
        for _, name in self.built.values():
            if name is not None:
                self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @staticmethod
    def _admin(*statements: str) -> None:
        admin = create_engine(make_url(POSTGRES_URL), isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                for statement in statements:
                    conn.execute(text(statement))
        finally:
            admin.dispose()


_templates: _Templates | None = None


def _get_templates() -> _Templates:
    """The test process's templates: one set for every module that imports the fixture, removed at exit."""
    global _templates
    if _templates is None:
        root = Path(tempfile.mkdtemp(prefix="sqa-loaded-"))
        _templates = _Templates(root)
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        atexit.register(_templates.close)
    return _templates


@pytest.fixture
def loaded_settings(settings) -> Settings:
    """Settings whose home holds the sample news, ingested through 2024-03 (three month shards): a copy
    of the template's files and database."""
    kind = "sqlite" if settings.db_url.startswith("sqlite") else "postgres"
    home, template = _get_templates().get(kind, settings)
    if template is not None:  # the test's scratch database, empty and unused so far, remade as a copy
        name = make_url(settings.db_url).database
        _Templates._admin(
            f'DROP DATABASE "{name}" WITH (FORCE)',
            f'CREATE DATABASE "{name}" TEMPLATE "{template}"',
        )
    shutil.copytree(home, settings.home, dirs_exist_ok=True)
    return settings
