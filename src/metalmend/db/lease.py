"""Leases on rows: how one replica, and only one, runs a stored job (a Drydock task, a
Shipyard action) when several replicas of ``metalmend serve`` share one database.

A job's row carries ``lease_owner`` and ``lease_expires``. A replica takes a job with one
conditional UPDATE (the lease is free, expired, or already its own): of two replicas
racing, the database lets one update the row. The owner renews the lease while it runs
the job; a replica that died stops renewing, and another takes the job over once the lease
has expired, continuing from what the job stored. Every write of the job's progress is
conditional on still holding the lease (``held``), so a replica that lost it (paused past
its lease) changes nothing more.

Synchronous (SQLAlchemy Core); async code calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    DateTime,
    String,
    Table,
    and_,
    or_,
    select,
    update,
)

from metalmend.db.database import Database


class LeaseLost(Exception):
    """Another replica runs the job now: this one stops, changing nothing more."""


def lease_columns() -> tuple[Column[Any], Column[Any]]:
    """A job table's lease: the replica running it and until when (free when expired)."""
    return (
        Column("lease_owner", String(128), nullable=True),
        Column("lease_expires", DateTime, nullable=True),
    )


def naive(moment: dt.datetime) -> dt.datetime:
    """Stored times are naive UTC (SQLite keeps no time zone)."""
    return moment.astimezone(dt.UTC).replace(tzinfo=None)


def aware(moment: dt.datetime) -> dt.datetime:
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment


@dataclass(frozen=True)
class Leases:
    """The leases of one table's jobs. ``unfinished`` selects the jobs still to run;
    ``created`` orders them (oldest first)."""

    db: Database
    table: Table
    key: Column[Any]
    unfinished: ColumnElement[bool]
    created: Column[Any]

    def runnable(self, now: dt.datetime) -> list[str]:
        """Jobs not finished whose lease is free or expired, oldest first."""
        owner, expires = self.table.c.lease_owner, self.table.c.lease_expires
        free = or_(owner.is_(None), expires < naive(now))
        query = select(self.key).where(and_(self.unfinished, free)).order_by(self.created)
        with self.db.read() as conn:
            return [str(row[0]) for row in conn.execute(query)]

    def take(self, job: str, owner: str, now: dt.datetime, until: dt.datetime) -> bool:
        """Take the lease of an unfinished job, if it is free, expired or ours."""
        c = self.table.c
        mine = or_(c.lease_owner.is_(None), c.lease_expires < naive(now), c.lease_owner == owner)
        where = and_(self.key == job, self.unfinished, mine)
        return self.update(where, {"lease_owner": owner, "lease_expires": naive(until)})

    def renew(self, job: str, owner: str, until: dt.datetime) -> bool:
        """Extend our lease; False when it is no longer ours."""
        return self.update(self.held(job, owner), {"lease_expires": naive(until)})

    def held(self, job: str, owner: str) -> ColumnElement[bool]:
        """The condition of every write made while running ``job``."""
        return and_(self.key == job, self.table.c.lease_owner == owner)

    def update(self, where: ColumnElement[bool], values: Mapping[str, Any]) -> bool:
        """One conditional UPDATE of the job's row: True when it matched."""
        with self.db.begin() as conn:
            return self.update_in(conn, where, values)

    def update_in(
        self, conn: Connection, where: ColumnElement[bool], values: Mapping[str, Any]
    ) -> bool:
        """``update`` inside the caller's transaction (to write other rows with it)."""
        return conn.execute(update(self.table).where(where).values(**values)).rowcount == 1
