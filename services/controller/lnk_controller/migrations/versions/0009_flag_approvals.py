"""remembered_specs: a flag-only approval is keyed by what it opens (`<flags>:HASH`).

Before, each owner had one `<flags>` row, replaced by every other set of flags approved; now
each set has its own row (`lnk_controller.remembered.flags_key`). The upgrade gives the one row
each owner had the key its own hash makes, so what was approved stays approved. The downgrade
keeps each owner's newest flag-only approval as the one `<flags>` row and forgets the others
(the older schema has room for one): those ask again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

from collections.abc import Sequence

from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute(
        "UPDATE remembered_specs SET spec_key = '<flags>:' || grants_hash "
        "WHERE spec_key = '<flags>'"
    )


def downgrade() -> None:
    # Every flag-only row but each owner's newest goes; the newest takes the old key.
    op.execute(
        "DELETE FROM remembered_specs WHERE substr(spec_key, 1, 8) = '<flags>:' AND id NOT IN ("
        " SELECT id FROM remembered_specs AS r WHERE substr(r.spec_key, 1, 8) = '<flags>:'"
        " AND r.id = (SELECT n.id FROM remembered_specs AS n"
        "  WHERE n.owner_uid = r.owner_uid AND substr(n.spec_key, 1, 8) = '<flags>:'"
        "  ORDER BY n.approved_at DESC, n.id DESC LIMIT 1))"
    )
    op.execute(
        "UPDATE remembered_specs SET spec_key = '<flags>' WHERE substr(spec_key, 1, 8) = '<flags>:'"
    )
