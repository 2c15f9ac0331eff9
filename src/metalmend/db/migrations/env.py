"""Alembic's environment: always given a connection by ``metalmend.db.migrate`` (the
caller's transaction; no URL, no ini file, no logging setup of Alembic's own)."""

from __future__ import annotations

from alembic import context

from metalmend.db.database import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only reachable through the alembic command line
    raise RuntimeError("run migrations through metalmend.db (Database.upgrade)")
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
