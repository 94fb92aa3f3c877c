"""passage bodies: stored passage text without its date prefix

Passages used to be stored as "Thursday, February 7, 2019. <body>"; they are stored as "<body>"
now, and the prefix is put back only where a model reads the text (indexer.chunking.dated_text).
The upgrade takes off each row's exact prefix, computed from its `published` day; the downgrade
puts it back. Rows are read and written in batches of primary keys, in Python, so it runs the
same on SQLite and PostgreSQL. The index files do not change: they were built from the dated text,
and the encoder and BM25 still read it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 12:00:00.000000
"""

import datetime as dt
from collections.abc import Callable

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BATCH = 2000  # rows read and written per round

# Only the columns this migration reads and writes, as they are at this revision.
passages = sa.table(
    "passages",
    sa.column("id", sa.Integer),
    sa.column("text", sa.Text),
    sa.column("published", sa.Date),
)


def date_prefix(published: dt.date) -> str:
    """'Thursday, February 7, 2019. ': the prefix of revision 0006's passage texts
    (indexer.chunking._date_prefix then; copied, so that this migration never changes)."""
    return f"{published:%A}, {published:%B} {published.day}, {published.year}. "


def _strip(text: str, published: dt.date) -> str:
    return text.removeprefix(date_prefix(published))


def _prefix(text: str, published: dt.date) -> str:
    return date_prefix(published) + text


def _rewrite(change: Callable[[str, dt.date], str]) -> None:
    """Every passage row's text replaced by `change(text, published)`, BATCH rows at a time."""
    bind = op.get_bind()
    update = passages.update().where(passages.c.id == sa.bindparam("row_id")).values(text=sa.bindparam("new_text"))
    last = None
    while True:
        query = sa.select(passages.c.id, passages.c.text, passages.c.published).order_by(passages.c.id).limit(BATCH)
        if last is not None:
            query = query.where(passages.c.id > last)
        rows = bind.execute(query).all()
        if not rows:
            return
        changed = [
            {"row_id": row_id, "new_text": new}
            for row_id, text, published in rows
            if (new := change(text, published)) != text
        ]
        if changed:
            bind.execute(update, changed)
        last = rows[-1][0]


def upgrade() -> None:
    _rewrite(_strip)


def downgrade() -> None:
    _rewrite(_prefix)
