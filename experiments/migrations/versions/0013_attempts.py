"""add attempts: experiments.attempt, events.attempt and the run_attempts table

A run that an infrastructure failure ended is dispatched again as a new attempt of the same
experiment (issue 25): new single-use secret_ids, a new scheduler job, the same id and quota.
``experiments.attempt`` is the current attempt (1 for every row made before this revision),
``events.attempt`` the attempt each event belongs to (NULL for older events), and ``run_attempts``
one row per ended attempt: its scheduler run id, how and why it ended, and its GPU time.
``experiments.prior_gpu_hours`` is the sum over the ended attempts, so GPU-hours and cost add up
over attempts without a query per listed experiment.

Revision ID: 0013_attempts
Revises: 0012_release
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013_attempts"
down_revision = "0012_release"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer, nullable=False, server_default="1"))
        batch.add_column(sa.Column("failure_class", sa.String(16)))
        batch.add_column(sa.Column("prior_gpu_hours", sa.Float, nullable=False, server_default="0"))
    with op.batch_alter_table("events") as batch:
        batch.add_column(sa.Column("attempt", sa.Integer))
    op.create_table(
        "run_attempts",
        sa.Column("experiment_id", sa.String(36), sa.ForeignKey("experiments.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("run_id", sa.String(255)),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("failure_class", sa.String(16)),
        sa.Column("cause", sa.String(64)),
        sa.Column("reason", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.Column("dispatched_at", sa.DateTime),
        sa.Column("placed_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime, nullable=False),
        sa.Column("gpu_hours", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("run_attempts")
    with op.batch_alter_table("events") as batch:
        batch.drop_column("attempt")
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("prior_gpu_hours")
        batch.drop_column("failure_class")
        batch.drop_column("attempt")
