"""The store's identity: one row, written when the database is first migrated (a random id
and the time), that says which store a database holds. ``metalmend serve`` records the id
it serves outside the database (``metalmend.serve.storeguard``) and compares: a database
removed and created again, or another one behind the same URL, holds another id.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Column, Connection, DateTime, Integer, String, Table, select

from metalmend.db.schema import metadata

store_identity = Table(
    "store_identity",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1: one row
    Column("store_id", String(32), nullable=False),
    Column("created_at", DateTime, nullable=False),  # naive UTC, as every stored time
)


@dataclass(frozen=True)
class Identity:
    id: str
    created: dt.datetime


def read_identity(conn: Connection) -> Identity | None:
    """The database's store; None when its table holds no row. A database without the
    table (not metalmend's, or emptied) fails as a fault of the database: 503, saying so
    (``metalmend.db.faults``)."""
    query = select(store_identity.c.store_id, store_identity.c.created_at)
    row = conn.execute(query.where(store_identity.c.id == 1)).first()
    if row is None:
        return None
    return Identity(str(row.store_id), row.created_at.replace(tzinfo=dt.UTC))
