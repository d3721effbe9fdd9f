"""store: conversations' events, the lease with its fencing token, nonces, the inbox.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
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
        "events",
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("conversation", sa.String(length=128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("appended_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent", "conversation", "seq", name="pk_events"),
    )
    op.create_table(
        "conversations",
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("conversation", sa.String(length=128), nullable=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent", "conversation", name="pk_conversations"),
    )
    op.create_table(
        "usage",
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent", name="pk_usage"),
    )
    op.create_table(
        "leases",
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("token", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(length=128), nullable=True),
        sa.Column("expires_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent", name="pk_leases"),
    )
    op.create_table(
        "nonces",
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("nonce", sa.LargeBinary(length=16), nullable=False),
        sa.Column("expires", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("agent", "nonce", name="pk_nonces"),
    )
    op.create_index("ix_nonces_expires", "nonces", ["expires"])
    op.create_table(
        "inbox",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("agent", sa.String(length=64), nullable=False),
        sa.Column("sender", sa.String(length=128), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("sent_at", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_inbox"),
    )
    op.create_index("ix_inbox_agent", "inbox", ["agent"])


def downgrade() -> None:
    op.drop_index("ix_inbox_agent", table_name="inbox")
    op.drop_table("inbox")
    op.drop_index("ix_nonces_expires", table_name="nonces")
    op.drop_table("nonces")
    op.drop_table("leases")
    op.drop_table("usage")
    op.drop_table("conversations")
    op.drop_table("events")
