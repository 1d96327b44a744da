"""add scheduler_identities: which scheduler each bound cluster name means

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "scheduler_identities",
        sa.Column("cluster", sa.String(64), primary_key=True),
        sa.Column("scheduler", sa.String(16), nullable=False),
        sa.Column("identity", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.DateTime, nullable=False),
        sa.Column("confirmed_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("scheduler_identities")
