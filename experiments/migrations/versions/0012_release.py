"""add experiments.released_at and release_held: proof that an ended run's GPUs were released

After a run ends, the reconcile pass confirms on the scheduler that nothing of it still holds GPUs
(Nomad allocations terminal, Kubernetes pods gone; experiments.background.orphans): ``released_at``
is when it saw that, ``release_held`` what it last saw still held (NULL once released). Runs that
ended before this revision are taken as released when they finished: the proof covers runs that end
after the upgrade, and the first pass does not write an event for every run in the history.

Revision ID: 0012_release
Revises: 0011_pool_usage
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_release"
down_revision = "0011_pool_usage"
branch_labels = None
depends_on = None

ENDED = ("succeeded", "failed", "cancelled", "expired")


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("released_at", sa.DateTime))
        batch.add_column(sa.Column("release_held", sa.Text))
    experiments = sa.table("experiments", sa.column("state", sa.String), sa.column("finished_at", sa.DateTime),
                           sa.column("updated_at", sa.DateTime), sa.column("released_at", sa.DateTime))
    op.execute(experiments.update().where(experiments.c.state.in_(ENDED))
               .values(released_at=sa.func.coalesce(experiments.c.finished_at, experiments.c.updated_at)))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("release_held")
        batch.drop_column("released_at")
