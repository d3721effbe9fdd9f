"""agents: each agent's name, owner, public key, spec, and host uid while it runs.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "agents",
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=40), nullable=False),
        sa.Column("public_key", sa.String(length=64), nullable=False),
        sa.Column("spec_path", sa.String(length=4096), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("host_uid", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("agent_id", name="pk_agents"),
        sa.UniqueConstraint("owner_uid", "name", name="uq_agents_owner_uid_name"),
    )


def downgrade() -> None:
    op.drop_table("agents")
