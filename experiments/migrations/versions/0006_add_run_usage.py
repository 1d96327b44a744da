"""add run_usage: each run's downsampled GPU utilization and memory series

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_usage",
        sa.Column("experiment_id", sa.String(36), sa.ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("at", sa.DateTime, primary_key=True),
        sa.Column("samples", sa.Integer, nullable=False),
        sa.Column("util_mean_pct", sa.Float, nullable=True),
        sa.Column("util_peak_pct", sa.Float, nullable=True),
        sa.Column("memory_peak_mib", sa.Float, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("run_usage")
