"""Alembic's environment for the controller database, run only through `lnk_controller.db`.

`lnk_controller.db` builds the alembic Config in code and hands over an open connection that is
already inside a `BEGIN IMMEDIATE` transaction (in `config.attributes["connection"]`), so the
whole upgrade is one atomic step that concurrent openers take in turn. There is no alembic.ini
and no offline (SQL script) mode.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from lnk_controller.models import Base


def run_migrations_online() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError(
            "the controller's migrations run through lnk_controller.db, which passes an open "
            "connection; the alembic command line is not supported"
        )
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        render_as_batch=True,
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("the controller's migrations have no offline (--sql) mode")
run_migrations_online()
