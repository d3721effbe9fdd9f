"""Alembic migrations of the controller database; run by `lnk_controller.db`, not by hand."""
