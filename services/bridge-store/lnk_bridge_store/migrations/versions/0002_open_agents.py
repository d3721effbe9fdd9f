"""open_agents: the agents whose sockets the controller opened, opened again at start.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "open_agents",
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("public_key", sa.String(length=64), nullable=False),
        sa.Column("host_uid", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent", name="pk_open_agents"),
    )


def downgrade() -> None:
    op.drop_table("open_agents")
