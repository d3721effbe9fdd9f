"""sandboxes: partial indexes on live rows (the launch path's and the reaper's queries) and on
ended rows (retention), so their cost does not grow with the history of ended sandboxes.

Each index's WHERE is spelled exactly as `sandbox_store` spells its queries' (`state !=
'ended'`, `state = 'ended'`): SQLite uses a partial index only when the query's WHERE implies
the index's, which it cannot see for `state IN (...)` or a bound parameter.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_sandboxes_live_created_at",
        "sandboxes",
        ["created_at"],
        sqlite_where=sa.text("state != 'ended'"),
    )
    op.create_index(
        "ix_sandboxes_live_owner_uid",
        "sandboxes",
        ["owner_uid", "created_at"],
        sqlite_where=sa.text("state != 'ended'"),
    )
    op.create_index(
        "ix_sandboxes_ended_ended_at",
        "sandboxes",
        ["ended_at"],
        sqlite_where=sa.text("state = 'ended'"),
    )


def downgrade() -> None:
    op.drop_index("ix_sandboxes_ended_ended_at", table_name="sandboxes")
    op.drop_index("ix_sandboxes_live_owner_uid", table_name="sandboxes")
    op.drop_index("ix_sandboxes_live_created_at", table_name="sandboxes")
