"""How the routers of ``metalmend serve`` reach the design store: who may read and write it
(Deckhand's permissions, group ``deckhand.metalmend.dev``), the store called in a worker
thread, its documents answered as YAML. Deckhand's routes (``routes.py``), Shipyard's
configdocs (``metalmend.siteactions.routes``) and Promenade's design references
(``metalmend.teardown.etcd.routes``) use these; the named interface of this package for
the other components' routers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from fastapi import Request, Response

from metalmend.designs import documents
from metalmend.designs.documents import DocumentsRejected
from metalmend.designs.store import DesignStore
from metalmend.web import auth
from metalmend.web.deps import database_of
from metalmend.web.status import StatusError, errors

GROUP = "deckhand.metalmend.dev"
YAML = "application/x-yaml"

PUT_DOCUMENTS = auth.Permission("buckets", "documents", "update", GROUP)
LIST_REVISIONS = auth.Permission("revisions", "", "list", GROUP)
GET_REVISION = auth.Permission("revisions", "", "get", GROUP)
CREATE_TAG = auth.Permission("revisions", "tags", "create", GROUP)
DELETE_TAG = auth.Permission("revisions", "tags", "delete", GROUP)
ROLLBACK = auth.Permission("revisions", "rollback", "create", GROUP)
DELETE_ALL = auth.Permission("revisions", "", "deletecollection", GROUP)

T = TypeVar("T")


async def run(request: Request, call: Callable[[DesignStore], T]) -> T:
    """``call`` on the store in a worker thread (its refusals, and the database
    unavailable, answered by the application's one handler)."""
    return await asyncio.to_thread(call, DesignStore(database_of(request)))


def rejected(error: DocumentsRejected, what: str) -> StatusError:
    return StatusError(400, "BadRequest", what, errors(*error.problems))


def yaml_answer(value: Any, code: int = 200) -> Response:
    return Response(documents.dump(value), status_code=code, media_type=YAML)


async def documents_answer(listed: Sequence[dict[str, Any]]) -> Response:
    """Documents as multi-document YAML, written in a worker thread: a whole design takes
    seconds to write, which would stop every other request on the event loop."""
    text = await asyncio.to_thread(documents.dump_all, list(listed))
    return Response(text, media_type=YAML)


def checked_name(raw: str, what: str) -> str:
    try:
        return documents.path_name(raw, what)
    except DocumentsRejected as error:
        raise rejected(error, f"bad {what} name") from None
