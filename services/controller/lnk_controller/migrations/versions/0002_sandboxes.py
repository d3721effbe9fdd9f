"""sandboxes: every sandbox's record, written before anything of it runs.

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
        "sandboxes",
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("owner_uid", sa.Integer(), nullable=False),
        sa.Column("host_uid", sa.Integer(), nullable=False),
        sa.Column("host_name", sa.String(length=32), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("pid_start", sa.BigInteger(), nullable=True),
        sa.Column("staging_dir", sa.String(length=4096), nullable=False),
        sa.Column("mounts_json", sa.Text(), nullable=False),
        sa.Column("command_json", sa.Text(), nullable=False),
        sa.Column("spec_hash", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(), nullable=False),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("exit_status", sa.Integer(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_sandboxes"),
    )
    # A host uid belongs to at most one sandbox that is not over.
    op.create_index(
        "ix_sandboxes_live_host_uid",
        "sandboxes",
        ["host_uid"],
        unique=True,
        sqlite_where=sa.text("state != 'ended'"),
    )
    op.create_index("ix_sandboxes_owner_uid", "sandboxes", ["owner_uid"])


def downgrade() -> None:
    op.drop_index("ix_sandboxes_owner_uid", table_name="sandboxes")
    op.drop_index("ix_sandboxes_live_host_uid", table_name="sandboxes")
    op.drop_table("sandboxes")
