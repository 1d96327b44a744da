"""add run_usage.util_max_pct and run_logs.changed_at: the evidence of the idle policy

The idle/hang policy (issue 25) stops a run whose every GPU stayed below a threshold, or whose
logs did not change, for a while. The utilization series kept only the run's mean (a 16-GPU run
with one busy GPU has a low mean), so each sample now also keeps its busiest GPU; and a kept log
tail only said when it was captured, not when it last changed. Existing rows: unknown busiest GPU
(NULL: the policy does not fire on them) and "changed when captured" (the safe assumption).
Indexes on run_usage.at and run_logs.captured_at let each pass re-read only the runs that changed.
Money budgets need no column: they live in the cluster files and spend is computed from the runs.

Revision ID: 0010_budgets
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_budgets"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("run_usage") as batch:
        batch.add_column(sa.Column("util_max_pct", sa.Float))
    with op.batch_alter_table("run_logs") as batch:
        batch.add_column(sa.Column("changed_at", sa.DateTime))
    op.execute("UPDATE run_logs SET changed_at = captured_at")
    op.create_index("ix_run_usage_at", "run_usage", ["at"])
    op.create_index("ix_run_logs_captured_at", "run_logs", ["captured_at"])


def downgrade() -> None:
    op.drop_index("ix_run_logs_captured_at", "run_logs")
    op.drop_index("ix_run_usage_at", "run_usage")
    with op.batch_alter_table("run_logs") as batch:
        batch.drop_column("changed_at")
    with op.batch_alter_table("run_usage") as batch:
        batch.drop_column("util_max_pct")
