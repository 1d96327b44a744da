"""create experiments, events and outbox

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "experiments",
        sa.Column("id", sa.String(36), primary_key=True),
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("job", sa.String(128), nullable=False),
        sa.Column("cluster", sa.String(64), nullable=False),
        sa.Column("pool", sa.String(64), nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("meta", sa.JSON, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.Column("scheduler", sa.String(16), nullable=False),
        sa.Column("run_id", sa.String(255)),
        sa.Column("submitted_by", sa.String(255), nullable=False),
        sa.Column("idempotency_key", sa.String(255)),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("deadline_hours", sa.Float, nullable=False),
        sa.Column("price_per_gpu_hour", sa.Float, nullable=False),
        sa.Column("price_kind", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("updated_at", sa.DateTime, nullable=False),
        sa.Column("dispatching_at", sa.DateTime),
        sa.Column("queued_at", sa.DateTime),
        sa.Column("provisioning_at", sa.DateTime),
        sa.Column("running_at", sa.DateTime),
        sa.Column("finished_at", sa.DateTime),
        sa.Column("deadline_at", sa.DateTime),
        sa.Column("cancel_requested_at", sa.DateTime),
        sa.Column("reconciled_at", sa.DateTime),
        sa.UniqueConstraint("tenant", "idempotency_key", name="uq_experiments_tenant_idempotency_key"),
    )
    op.create_index("ix_experiments_state", "experiments", ["state"])
    op.create_index("ix_experiments_tenant_state", "experiments", ["tenant", "state"])
    op.create_table(
        "events",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("experiment_id", sa.String(36), sa.ForeignKey("experiments.id")),
        sa.Column("at", sa.DateTime, nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("from_state", sa.String(16)),
        sa.Column("to_state", sa.String(16)),
        sa.Column("message", sa.Text, nullable=False),
    )
    op.create_index("ix_events_experiment", "events", ["experiment_id", "id"])
    op.create_table(
        "outbox",
        sa.Column("experiment_id", sa.String(36), sa.ForeignKey("experiments.id"), primary_key=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", sa.DateTime, nullable=False),
        sa.Column("lease_until", sa.DateTime),
        sa.Column("last_error", sa.Text),
    )


def downgrade() -> None:
    op.drop_table("outbox")
    op.drop_index("ix_events_experiment", table_name="events")
    op.drop_table("events")
    op.drop_index("ix_experiments_tenant_state", table_name="experiments")
    op.drop_index("ix_experiments_state", table_name="experiments")
    op.drop_table("experiments")
