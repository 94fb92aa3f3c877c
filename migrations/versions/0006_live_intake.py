"""live intake: article versions, the live queue and the polled feeds

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-02 18:00:00.000000
"""

import sqlalchemy as sa
from alembic import op

import store.base

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("articles") as batch:
        batch.add_column(sa.Column("version", sa.Integer(), server_default=sa.text("1"), nullable=False))
        batch.add_column(sa.Column("updated_at", store.base.UTCDateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("authors", sa.JSON(), server_default="[]", nullable=False))
        batch.add_column(sa.Column("language", sa.String(length=16), server_default="", nullable=False))
    # The defaults only fill the rows already there; new rows get theirs from the ORM.
    with op.batch_alter_table("articles") as batch:
        batch.alter_column("authors", server_default=None)
        batch.alter_column("language", server_default=None)
    op.create_table(
        "live_queue",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("article_id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("month", sa.String(length=7), nullable=False),
        sa.Column("queued_at", store.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("via", sa.String(length=16), nullable=False),
        sa.ForeignKeyConstraint(
            ["article_id"], ["articles.id"], name=op.f("fk_live_queue_article_id_articles"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_live_queue")),
        sa.UniqueConstraint("article_id", name=op.f("uq_live_queue_article_id")),
    )
    op.create_index(op.f("ix_live_queue_month"), "live_queue", ["month"], unique=False)
    op.create_table(
        "feeds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("title", sa.Text(), nullable=False),
        sa.Column("source", sa.String(length=64), nullable=False),
        sa.Column("active", sa.Boolean(), server_default=sa.true(), nullable=False),
        sa.Column("etag", sa.String(length=512), nullable=True),
        sa.Column("last_modified", sa.String(length=128), nullable=True),
        sa.Column("created_at", store.base.UTCDateTime(timezone=True), nullable=False),
        sa.Column("last_fetch_at", store.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_ok_at", store.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("next_fetch_at", store.base.UTCDateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("last_new", sa.Integer(), nullable=False),
        sa.Column("articles_total", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_feeds")),
        sa.UniqueConstraint("url", name=op.f("uq_feeds_url")),
    )


def downgrade() -> None:
    op.drop_table("feeds")
    op.drop_index(op.f("ix_live_queue_month"), table_name="live_queue")
    op.drop_table("live_queue")
    with op.batch_alter_table("articles") as batch:
        batch.drop_column("language")
        batch.drop_column("authors")
        batch.drop_column("updated_at")
        batch.drop_column("version")
