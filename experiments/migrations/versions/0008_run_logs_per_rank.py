"""run_logs per rank: a multi-node GKE run keeps the tail of every rank, not only rank 0's

The primary key grows from (experiment_id, stream) to (experiment_id, rank, stream); SQLite cannot
change a primary key in place, so the table is rebuilt and the kept tails copied as rank 0.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def _create(name: str, *, ranked: bool) -> None:
    op.create_table(
        name,
        sa.Column("experiment_id", sa.String(36), sa.ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True),
        *([sa.Column("rank", sa.Integer, primary_key=True, nullable=False, server_default="0")] if ranked else []),
        sa.Column("stream", sa.String(8), primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("captured_at", sa.DateTime, nullable=False),
    )


def upgrade() -> None:
    _create("run_logs_ranked", ranked=True)
    op.execute("INSERT INTO run_logs_ranked (experiment_id, rank, stream, text, captured_at) "
               "SELECT experiment_id, 0, stream, text, captured_at FROM run_logs")
    op.drop_table("run_logs")
    op.rename_table("run_logs_ranked", "run_logs")


def downgrade() -> None:
    _create("run_logs_unranked", ranked=False)
    op.execute("INSERT INTO run_logs_unranked (experiment_id, stream, text, captured_at) "
               "SELECT experiment_id, stream, text, captured_at FROM run_logs WHERE rank = 0")
    op.drop_table("run_logs")
    op.rename_table("run_logs_unranked", "run_logs")
