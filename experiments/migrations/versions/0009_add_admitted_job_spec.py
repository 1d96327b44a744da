"""add experiments.job_spec and job_spec_sha256: the job file as admitted

Admission checks a job file; dispatch must run that file, not whatever the file says by then
(issue 25: eight one-GPU runs became eight two-GPU runs while quota and cost still counted
eight). The checked document (Vault references only, never a value: the loader refuses
secret-looking strings) and its digest are kept with the experiment. Rows admitted before
this revision have NULL and are dispatched from the file, as they were.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.add_column(sa.Column("job_spec", sa.JSON))
        batch.add_column(sa.Column("job_spec_sha256", sa.String(64)))


def downgrade() -> None:
    with op.batch_alter_table("experiments") as batch:
        batch.drop_column("job_spec_sha256")
        batch.drop_column("job_spec")
