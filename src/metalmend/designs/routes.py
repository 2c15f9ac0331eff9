"""Deckhand's design revisions (docs/design-store.md), under ``/deckhand/api/v1.0``.

YAML in and out (``application/x-yaml``) as Deckhand's API reference has it
(https://airship-deckhand.readthedocs.io), errors too: Status bodies written as YAML, as
Deckhand's (``web.conventions.status_answer``). Documents are stored and answered as
they were put but for Deckhand's metadata defaults (``documents.with_defaults``): no
layering, no substitution (``rendered-documents`` leaves out only abstract documents).

Each endpoint's permission is a verb on a resource of the API group
``deckhand.metalmend.dev`` (deploy/rbac/serve.yaml): ``update buckets/documents`` for the
bucket, ``get``/``list`` ``revisions`` to read, ``create``/``delete`` ``revisions/tags``,
``create revisions/rollback``, ``deletecollection revisions``.

The tags Shipyard's rules read (``committed``, ``rollback_commit``,
``site-action-success``, ``site-action-failure``: which revision is committed, which one
redeploy_server deploys) are written by Shipyard only, through its commit and its
actions: this API refuses to set or remove them (403), whoever asks.

The store is synchronous (SQLAlchemy): every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from fastapi import APIRouter, Request, Response

from metalmend.api import tags
from metalmend.designs import documents, rules
from metalmend.designs.access import (
    CREATE_TAG,
    DELETE_ALL,
    DELETE_TAG,
    GET_REVISION,
    LIST_REVISIONS,
    PUT_DOCUMENTS,
    ROLLBACK,
    checked_name,
    documents_answer,
    rejected,
    run,
    yaml_answer,
)
from metalmend.designs.documents import DocumentsRejected
from metalmend.web import auth, bodies
from metalmend.web.status import StatusError, documented, errors

PREFIX = "/deckhand/api/v1.0"
CREATED_HEADER = "X-Revision-Created"  # a put's answer: "false" when nothing changed
MAX_REVISION = 2**31 - 1  # the revision column is a 32-bit integer on every database


log = logging.getLogger(__name__)
router = APIRouter(tags=["deckhand"])
T = TypeVar("T")


def revision_id(raw: str) -> int:
    """A revision number from the path: a whole number (0: the empty revision)."""
    if not raw.isascii() or not raw.isdigit():
        raise StatusError(400, "BadRequest", f"{raw[:40]!r} is not a revision number")
    if len(raw) > 10 or int(raw) > MAX_REVISION:  # beyond any number the store gives out
        raise StatusError(404, "NotFound", f"revision {raw[:40]} not found")
    return int(raw)


def revision_view(summary: Any, request: Request) -> dict[str, Any]:
    return {
        "id": summary.id,
        "createdAt": summary.created_at.isoformat(),
        "url": str(request.url_for("get_revision", revision=str(summary.id))),
        "status": "success",
        "tags": summary.tags,
        "buckets": list(summary.buckets),
        "validationPolicies": [],
    }


# --- buckets -----------------------------------------------------------------------------


@router.put(
    "/buckets/{bucket}/documents",
    summary="Replace a bucket's documents (multi-document YAML): a new revision if they changed",
    description="Documents left out are deleted from the bucket; an empty body empties it."
    " Putting exactly what the bucket holds creates no revision. Answer: the bucket's"
    " documents, each with status.bucket and status.revision.",
    responses=documented((200, "Success"), (409, "Conflict"), (413, "RequestEntityTooLarge")),
    dependencies=[auth.Admit(PUT_DOCUMENTS, "bucket")],
)
async def put_documents(bucket: str, request: Request) -> Response:
    name = checked_name(bucket, "bucket")
    text = await bodies.read_design(request)
    async with bodies.design_gate(request):
        try:
            parsed = await asyncio.to_thread(documents.parse, text, bodies.limits_of(request).yaml)
        except DocumentsRejected as error:
            raise rejected(
                error, f"bucket {name}: the documents cannot be stored; nothing stored"
            ) from None
        del text
        result = await run(request, lambda store: store.put(name, parsed))
        listed = [e.document.to_wire(e.bucket, result.revision) for e in result.entries]
        # As Deckhand: the revision is answered even when the bucket is now empty.
        empty = [{"status": {"bucket": name, "revision": result.revision}}]
        answer = await documents_answer(listed or empty)
    answer.headers[CREATED_HEADER] = "true" if result.created else "false"
    return answer


# --- revisions ---------------------------------------------------------------------------


@router.get(
    "/revisions",
    summary="List revisions (query: tag, sort, order)",
    responses=documented((200, "Success")),
    dependencies=[auth.Admit(LIST_REVISIONS)],
)
async def list_revisions(request: Request) -> Response:
    try:
        query = rules.revision_query(request.query_params.multi_items())
    except DocumentsRejected as error:
        raise rejected(error, "bad query") from None
    found = await run(request, lambda store: store.revisions(query))
    results = [
        {
            "id": s.id,
            "createdAt": s.created_at.isoformat(),
            "tags": sorted(s.tags),
            "buckets": list(s.buckets),
        }
        for s in found
    ]
    return yaml_answer({"count": len(results), "results": results})


@router.delete(
    "/revisions",
    summary="Delete every revision, tag and document (numbering goes on)",
    responses=documented((204, "Success")),
    dependencies=[auth.Admit(DELETE_ALL)],
)
async def delete_revisions(request: Request) -> Response:
    await run(request, lambda store: store.delete_all())
    return Response(status_code=204)


@router.get(
    "/revisions/{revision}",
    name="get_revision",
    summary="A revision: id, createdAt, tags with their data, buckets",
    responses=documented((200, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_REVISION, "revision")],
)
async def get_revision(revision: str, request: Request) -> Response:
    number = revision_id(revision)
    summary = await run(request, lambda store: store.revision(number))
    return yaml_answer(revision_view(summary, request))


async def _documents(revision: str, request: Request, rendered: bool) -> Response:
    number = revision_id(revision)
    try:
        query = rules.document_query(request.query_params.multi_items(), rendered)
    except DocumentsRejected as error:
        raise rejected(error, "bad query") from None
    entries = await run(request, lambda store: store.entries(number))  # 0: the empty one
    chosen = rules.select(entries, query, rendered)
    return await documents_answer([e.document.to_wire(e.bucket, e.revision) for e in chosen])


@router.get(
    "/revisions/{revision}/documents",
    summary="A revision's documents as stored (filters: schema, metadata.name, metadata.label,"
    " status.bucket, metadata.layeringDefinition.abstract|layer; sort, order, limit)",
    responses=documented((200, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_REVISION, "revision")],
)
async def revision_documents(revision: str, request: Request) -> Response:
    return await _documents(revision, request, rendered=False)


@router.get(
    "/revisions/{revision}/rendered-documents",
    summary="A revision's concrete documents: no layering or substitution (docs/design-store.md)",
    description="The stored documents, abstract ones left out; the same filters as documents"
    " but the layeringDefinition ones.",
    responses=documented((200, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_REVISION, "revision")],
)
async def rendered_documents(revision: str, request: Request) -> Response:
    return await _documents(revision, request, rendered=True)


@router.get(
    "/revisions/{first}/diff/{second}",
    summary="Per bucket: created, deleted, modified or unmodified (revision 0: empty)",
    responses=documented((200, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_REVISION, "first"), auth.Admit(GET_REVISION, "second")],
)
async def diff(first: str, second: str, request: Request) -> Response:
    a, b = revision_id(first), revision_id(second)
    changes = await run(request, lambda store: store.diff(a, b))
    return yaml_answer({bucket: str(change) for bucket, change in changes.items()})


@router.post(
    "/rollback/{revision}",
    summary="A new revision holding what this one held (0: nothing)",
    responses=documented((201, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(ROLLBACK, "revision")],
)
async def rollback(revision: str, request: Request) -> Response:
    number = revision_id(revision)
    created = await run(request, lambda store: store.rollback(number))
    summary = await run(request, lambda store: store.revision(created))
    return yaml_answer(revision_view(summary, request), 201)


# --- tags --------------------------------------------------------------------------------

SHIPYARD_TAGS = tags.COMMIT_TAGS | tags.SITE_ACTION_TAGS


def _shipyards(names: Sequence[str], number: int, doing: str) -> None:
    """403 for a tag Shipyard's rules read: set by hand, it would commit a revision past
    validation or make redeploy_server deploy it."""
    reserved = sorted(set(names) & SHIPYARD_TAGS)
    if reserved:
        text = (
            f"tag(s) {', '.join(reserved)} of revision {number} are Shipyard's (which revision"
            f" is committed, which one a site action deployed): they cannot be {doing} through"
            " Deckhand's API; commit with Shipyard (commitconfigdocs), or run a site action"
        )
        raise StatusError(403, "Forbidden", text, errors(text))


@router.post(
    "/revisions/{revision}/tags/{tag}",
    summary="Tag a revision, with an optional YAML mapping as the tag's data (again: replaced)",
    responses=documented((201, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(CREATE_TAG, "revision")],
)
async def create_tag(revision: str, tag: str, request: Request) -> Response:
    number, name = revision_id(revision), checked_name(tag, "tag")
    _shipyards([name], number, "set")
    try:
        text = await bodies.read_text(request, bodies.SMALL_BODY)
        data = documents.tag_data(text, bodies.SMALL_YAML)
    except DocumentsRejected as error:
        raise rejected(error, f"tag {name}: bad data") from None
    await run(request, lambda store: store.tag(number, name, data))
    return yaml_answer({name: data}, 201)


@router.get(
    "/revisions/{revision}/tags",
    summary="A revision's tags with their data",
    responses=documented((200, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_REVISION, "revision")],
)
async def list_tags(revision: str, request: Request) -> Response:
    number = revision_id(revision)
    return yaml_answer(await run(request, lambda store: store.tags(number)))


@router.get(
    "/revisions/{revision}/tags/{tag}",
    summary="One tag of a revision with its data",
    responses=documented((200, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(GET_REVISION, "revision")],
)
async def get_tag(revision: str, tag: str, request: Request) -> Response:
    number, name = revision_id(revision), checked_name(tag, "tag")
    found = await run(request, lambda store: store.tags(number))
    if name not in found:
        raise StatusError(404, "NotFound", f"revision {number} has no tag {name!r}")
    return yaml_answer({name: found[name]})


@router.delete(
    "/revisions/{revision}/tags/{tag}",
    summary="Remove one tag of a revision",
    responses=documented((204, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(DELETE_TAG, "revision")],
)
async def delete_tag(revision: str, tag: str, request: Request) -> Response:
    number, name = revision_id(revision), checked_name(tag, "tag")
    _shipyards([name], number, "removed")
    await run(request, lambda store: store.delete_tag(number, name))
    return Response(status_code=204)


@router.delete(
    "/revisions/{revision}/tags",
    summary="Remove every tag of a revision",
    responses=documented((204, "Success"), (404, "NotFound")),
    dependencies=[auth.Admit(DELETE_TAG, "revision")],
)
async def delete_tags(revision: str, request: Request) -> Response:
    number = revision_id(revision)
    _shipyards(list(await run(request, lambda store: store.tags(number))), number, "removed")
    await run(request, lambda store: store.delete_tags(number))
    return Response(status_code=204)
