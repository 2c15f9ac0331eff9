"""What the application gives the routers of ``metalmend serve``, by type: each service is
provided once when the application is built (``provide``, in ``metalmend.serve.app``) and
reached by its type, typed: ``of(request, Drainer)`` in an endpoint or a helper that holds
the request, or as a FastAPI dependency in an endpoint's signature
(``Annotated[Drainer, Provided(Drainer)]``). Nothing else reads ``app.state``."""

from __future__ import annotations

from typing import Annotated, Any, TypeVar, cast

from fastapi import Depends, FastAPI, Request

from metalmend.db import Database
from metalmend.web.status import StatusError

T = TypeVar("T")


def _provided(app: FastAPI) -> dict[type, object]:
    found: dict[type, object] | None = getattr(app.state, "provided", None)
    if found is None:
        found = app.state.provided = {}
    return found


def provide(app: FastAPI, kind: type[T], value: T | None) -> None:
    """Give the routers ``value`` as the ``kind`` (None: this application has none)."""
    _provided(app)[kind] = value


def find(app: FastAPI, kind: type[T]) -> T | None:
    """The ``kind`` the application was given, or None."""
    return cast("T | None", _provided(app).get(kind))


def of(request: Request, kind: type[T], missing: str = "") -> T:
    """The ``kind`` the application was given; 503 (``missing`` says why) without one."""
    found = find(request.app, kind)
    if found is None:
        text = missing or f"metalmend serve has no {kind.__name__}"
        raise StatusError(503, "ServiceUnavailable", text)
    return found


def Provided(kind: type[T], missing: str = "") -> Any:
    """``of`` as a FastAPI dependency: ``drainer: Annotated[Drainer, Provided(Drainer)]``."""

    def get(request: Request) -> T:
        return of(request, kind, missing)

    return Depends(get)


NO_DATABASE = "metalmend serve has no database"


def database_of(request: Request) -> Database:
    """The application's database; 503 when it was built without one."""
    return of(request, Database, NO_DATABASE)


DatabaseDep = Annotated[Database, Provided(Database, NO_DATABASE)]
