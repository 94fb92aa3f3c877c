"""eval results: whether each answer was grounded and how sure the reader was

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30 02:30:00.000000
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Both stay NULL on the rows of earlier runs: not known, left out of the trust figures.
    with op.batch_alter_table("eval_results") as batch:
        batch.add_column(sa.Column("grounded", sa.Boolean(), nullable=True))
        batch.add_column(sa.Column("confidence", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("eval_results") as batch:
        batch.drop_column("confidence")
        batch.drop_column("grounded")
