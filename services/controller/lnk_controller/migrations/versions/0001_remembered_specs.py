"""remembered_specs: the specs whose grants each owner approved.

Revision ID: 0001
Revises:
Create Date: 2025-11-29
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "remembered_specs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("spec_key", sa.String(length=4096), nullable=False),
        sa.Column("grants_hash", sa.String(length=64), nullable=False),
        sa.Column("grants_json", sa.Text(), nullable=False),
        sa.Column("approved_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_remembered_specs"),
        sa.UniqueConstraint("owner_uid", "spec_key", name="uq_remembered_specs_owner_uid_spec_key"),
    )


def downgrade() -> None:
    op.drop_table("remembered_specs")
