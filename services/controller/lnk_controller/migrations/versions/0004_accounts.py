"""accounts: the proof, per uid, that the records kept for it are one person's.

Records made before this revision belong to whichever account of their uid calls first.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "accounts",
        sa.Column("uid", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=256), nullable=False),
        sa.Column("home", sa.String(length=4096), nullable=False),
        sa.Column("home_dev", sa.BigInteger(), nullable=False),
        sa.Column("home_ino", sa.BigInteger(), nullable=False),
        sa.Column("home_generation", sa.BigInteger(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("uid", name="pk_accounts"),
    )


def downgrade() -> None:
    op.drop_table("accounts")
