"""add run_logs: the masked tail of each run's stdout and stderr, kept when it ends

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_logs",
        sa.Column("experiment_id", sa.String(36), sa.ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("stream", sa.String(8), primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("captured_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_logs")
