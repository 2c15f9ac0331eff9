"""What the routers of ``metalmend serve`` are given by the application, as FastAPI
dependencies and helpers: the database, the services built once per application."""

from __future__ import annotations

from fastapi import Request

from metalmend.db import Database
from metalmend.web.status import StatusError


def database_of(request: Request) -> Database:
    """The application's database; 503 when it was built without one."""
    database: Database | None = request.app.state.services.database
    if database is None:
        raise StatusError(503, "ServiceUnavailable", "metalmend serve has no database")
    return database
