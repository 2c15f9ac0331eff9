"""metalmend serve's database: one SQLAlchemy ``MetaData`` every table module declares on,
and ``Database``, an engine opened from a URL with its schema upgraded by Alembic.

SQLite (a file: ``sqlite:////var/lib/metalmend/serve.sqlite``) needs nothing else and is
the default; PostgreSQL (``postgresql+psycopg://user:password@host/db``) is for operators
who run more than one replica (docs/design-store.md). Code uses SQLAlchemy Core through
``with db.begin() as conn:``; async code calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

from metalmend.db.database import (
    Database,
    DatabaseError,
    DatabaseUnavailable,
    StoreReplaced,
    metadata,
)
from metalmend.db.identity import Identity, read_identity

__all__ = [
    "Database",
    "DatabaseError",
    "DatabaseUnavailable",
    "Identity",
    "StoreReplaced",
    "metadata",
    "read_identity",
]
