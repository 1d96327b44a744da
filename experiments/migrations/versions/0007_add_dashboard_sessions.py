"""add dashboard_sessions: server-side dashboard sessions (hashed id, token, expiry)

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "dashboard_sessions",
        sa.Column("id_sha256", sa.String(64), primary_key=True),
        sa.Column("token_id", sa.String(16), sa.ForeignKey("api_tokens.id", ondelete="CASCADE"), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("last_seen_at", sa.DateTime, nullable=False),
        sa.Column("expires_at", sa.DateTime, nullable=False),
    )
    op.create_index("ix_dashboard_sessions_token", "dashboard_sessions", ["token_id"])
    op.create_index("ix_dashboard_sessions_expires", "dashboard_sessions", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_dashboard_sessions_expires", table_name="dashboard_sessions")
    op.drop_index("ix_dashboard_sessions_token", table_name="dashboard_sessions")
    op.drop_table("dashboard_sessions")
