"""add experiments.scheduler_refs: what the scheduler calls the run's pieces

Nomad: job, allocation, node; GKE: Job, Kueue Workload, ClusterQueue, flavor. Recorded by the
reconciler so the API shows them after the scheduler has forgotten the run.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("scheduler_refs", sa.JSON))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("scheduler_refs")
