"""Alembic's environment for the store database, run only through `lnk_bridge_store.db`, which
hands over a connection already inside a write transaction: the upgrade is one atomic step."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from lnk_bridge_store.models import Base


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError("the store's migrations run through lnk_bridge_store.db only")
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("the store's migrations have no offline (--sql) mode")
run_migrations_online()
