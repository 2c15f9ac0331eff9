"""The design store's rules (no I/O): which documents a query selects, how two revisions
differ per bucket, what a put changes. The store (``store.py``) reads and writes; these
decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TypeVar

from metalmend.designs.documents import Document, DocumentsRejected, Identity

Query = Sequence[tuple[str, str]]
T = TypeVar("T")


@dataclass(frozen=True)
class Placed:
    """Where a document is in a revision, without its contents: enough to diff and to
    plan a put without reading a single document body."""

    bucket: str
    identity: Identity
    digest: str
    revision: int  # where it last changed (status.revision)


@dataclass(frozen=True)
class Entry:
    """A document in a revision: its bucket and the revision where it last changed."""

    bucket: str
    revision: int
    document: Document


class BucketChange(StrEnum):
    CREATED = "created"
    DELETED = "deleted"
    MODIFIED = "modified"
    UNMODIFIED = "unmodified"


Contents = Mapping[str, Mapping[Identity, str]]  # bucket -> identity -> digest


def contents_of(placed: Sequence[Placed]) -> dict[str, dict[Identity, str]]:
    found: dict[str, dict[Identity, str]] = {}
    for where in placed:
        found.setdefault(where.bucket, {})[where.identity] = where.digest
    return found


def bucket_diff(older: Contents, newer: Contents) -> dict[str, BucketChange]:
    """Deckhand's diff: every bucket holding documents in either revision, created (only
    in the newer), deleted (only in the older), modified or unmodified (the same documents
    with the same contents). The caller passes the older revision first whatever order
    the request named them in; revision 0 is the empty revision."""
    changes: dict[str, BucketChange] = {}
    for bucket in sorted(set(older) | set(newer)):
        before, after = older.get(bucket), newer.get(bucket)
        if not before:
            change = BucketChange.CREATED
        elif not after:
            change = BucketChange.DELETED
        else:
            change = BucketChange.UNMODIFIED if before == after else BucketChange.MODIFIED
        if before or after:
            changes[bucket] = change
    return changes


# --- puts ------------------------------------------------------------------------------


@dataclass(frozen=True)
class PutPlan:
    """What a put of ``bucket`` does to the newest revision."""

    changed: bool  # False: the bucket already holds exactly these documents
    elsewhere: tuple[tuple[Identity, str], ...]  # (identity, bucket) living elsewhere: 409
    # The bucket's documents after the put, each with the revision where it last changed
    # (None: changed by this put, so the new revision).
    mine: tuple[tuple[Document, int | None], ...]


def plan_put(head: Sequence[Placed], bucket: str, documents: Sequence[Document]) -> PutPlan:
    """``bucket``'s contents become ``documents`` (one left out is deleted); the other
    buckets keep theirs. A document whose identity another bucket holds is refused."""
    owners = {p.identity: p.bucket for p in head}
    elsewhere = tuple(
        (d.identity, owners[d.identity])
        for d in documents
        if owners.get(d.identity, bucket) != bucket
    )
    before = {p.identity: p for p in head if p.bucket == bucket}
    mine = tuple(
        (d, before[d.identity].revision)
        if d.identity in before and before[d.identity].digest == d.digest
        else (d, None)
        for d in documents
    )
    changed = len(before) != len(documents) or any(revision is None for _, revision in mine)
    return PutPlan(changed, elsewhere, mine)


def rollback_revisions(head: Sequence[Placed], target: Sequence[Placed]) -> list[int | None]:
    """For each of ``target``'s documents, the revision where it last changed once it is
    the newest again: kept where the head holds it unchanged in the same bucket, else
    None (the rollback's new revision changes it)."""
    now = {p.identity: p for p in head}
    return [
        now[p.identity].revision
        if p.identity in now
        and (now[p.identity].digest, now[p.identity].bucket) == (p.digest, p.bucket)
        else None
        for p in target
    ]


def conflict_message(
    elsewhere: Sequence[tuple[Identity, str]], documents: Sequence[Document]
) -> str:
    """Deckhand's words for a document put into one bucket while another holds it
    (its ``DuplicateDocumentExists``, 409: "Document [schema, layer] name already exists
    in bucket: other"), for the first such document; the count when there are more."""
    layers = {d.identity: d.layering.get("layer") for d in documents}
    (schema, name), owner = elsewhere[0]
    layer = layers.get((schema, name))
    first = f"Document [{schema}, {layer}] {name} already exists in bucket: {owner}"
    more = len(elsewhere) - 1
    return first if not more else f"{first} (and {more} more document(s) in other buckets)"


def conflict_lines(elsewhere: Sequence[tuple[Identity, str]], bucket: str) -> list[str]:
    return [
        f"schema {schema} name {name!r} lives in bucket {owner}, not {bucket}: delete it"
        " there first (identity is unique across buckets)"
        for (schema, name), owner in elsewhere
    ]


# --- queries ---------------------------------------------------------------------------
#
# Deckhand's API reference (doc/source/operators/api_ref.rst in airshipit/deckhand) and its
# code (deckhand/control/common.py ``sanitize_params``, deckhand/common/utils.py
# ``deepfilter``, ``multisort``) read a query so: different filters all apply (AND); one
# filter repeated matches any of its values (OR), but ``metadata.label``, whose repeats
# must all match; a filter nothing satisfies answers no documents, never an error;
# ``limit`` must be a whole number (anything else is 400). Where Deckhand's code silently
# reads a malformed value as something else (an unknown ``order`` as ascending, a negative
# ``limit`` as its absolute value, an unknown parameter as absent), this store answers 400
# naming the value, so that a typo is never "no filter" (docs/design-store.md, "Deviations").

SORT_KEYS = ("schema", "metadata.name", "status.bucket", "status.revision")
DEFAULT_SORT = ("status.bucket", "schema", "metadata.name")
ORDERS = ("asc", "desc")


@dataclass(frozen=True)
class DocumentQuery:
    """``GET /revisions/{id}/documents`` (and ``rendered-documents``)'s filters. Each tuple
    but ``labels`` is "any of" (empty: no filter); ``labels`` must all match."""

    schemas: tuple[str, ...] = ()
    names: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    buckets: tuple[str, ...] = ()
    abstract: tuple[bool, ...] = ()
    layers: tuple[str, ...] = ()
    sort: tuple[str, ...] = DEFAULT_SORT
    descending: bool = False
    limit: int | None = None


DOCUMENT_PARAMETERS = (
    "schema", "metadata.name", "metadata.label", "status.bucket",
    "metadata.layeringDefinition.abstract", "metadata.layeringDefinition.layer",
    "sort", "order", "limit",
)  # fmt: skip
SINGLE = ("order", "limit")  # Deckhand's code: given twice, limit is 400, order ignored
RENDERED_PARAMETERS = tuple(p for p in DOCUMENT_PARAMETERS if "layeringDefinition" not in p)
LIMIT_DIGITS = 18  # past any count of documents: no limit


def document_query(query: Query, rendered: bool = False) -> DocumentQuery:
    """The filters of a query string; unknown or malformed ones are refused (400), so a
    typo is not silently "no filter"."""
    known = RENDERED_PARAMETERS if rendered else DOCUMENT_PARAMETERS
    values: dict[str, list[str]] = {}
    for key, value in query:
        if key not in known:
            raise DocumentsRejected(
                [f"unknown query parameter {key!r} (known: {', '.join(known)})"]
            )
        values.setdefault(key, []).append(value)
    for single in SINGLE:
        if len(values.get(single, ())) > 1:
            raise DocumentsRejected([f"query parameter {single!r} is given more than once"])
    return DocumentQuery(
        schemas=_distinct(values.get("schema", ())),
        names=_distinct(values.get("metadata.name", ())),
        labels=tuple(_label(raw) for raw in values.get("metadata.label", ())),
        buckets=_distinct(values.get("status.bucket", ())),
        abstract=_distinct(
            [_boolean(raw) for raw in values.get("metadata.layeringDefinition.abstract", ())]
        ),
        layers=_distinct(values.get("metadata.layeringDefinition.layer", ())),
        sort=_sort(values.get("sort", ())),
        descending=_descending(_one(values, "order")),
        limit=_limit(_one(values, "limit")),
    )


def _distinct(values: Sequence[T]) -> tuple[T, ...]:
    return tuple(dict.fromkeys(values))


def _one(values: Mapping[str, list[str]], key: str) -> str | None:
    found = values.get(key)
    return found[0] if found else None


def _label(raw: str) -> tuple[str, str]:
    key, equals, value = raw.partition("=")
    if not equals or not key:
        raise DocumentsRejected([f"metadata.label {raw[:80]!r} is not key=value"])
    return key, value


def _boolean(raw: str) -> bool:
    if raw.lower() not in ("true", "false"):
        raise DocumentsRejected(
            [f"metadata.layeringDefinition.abstract is true or false, not {raw[:20]!r}"]
        )
    return raw.lower() == "true"


def _sort(raw: Sequence[str]) -> tuple[str, ...]:
    keys = tuple(k for value in raw for k in value.split(",") if k)
    unknown = [k for k in keys if k not in SORT_KEYS]
    if unknown:
        raise DocumentsRejected(
            [f"sort by {unknown[0][:40]!r}: sort keys are {', '.join(SORT_KEYS)}"]
        )
    return keys or DEFAULT_SORT


def _descending(raw: str | None) -> bool:
    if raw is not None and raw not in ORDERS:
        raise DocumentsRejected([f"order is asc or desc, not {raw[:20]!r}"])
    return raw == "desc"


def _limit(raw: str | None) -> int | None:
    """A whole number: 0 answers no document (as Deckhand's ``documents[:0]``); a
    negative one, which Deckhand's code reads as its absolute value, is refused."""
    if raw is None:
        return None
    if not raw.isascii() or not raw.isdigit():
        what = "a negative count" if raw.startswith("-") else "not a whole number"
        raise DocumentsRejected(
            [f"limit is the number of documents to answer (0 or more), not {raw[:20]!r}"
             f" ({what})"]
        )  # fmt: skip
    return int(raw) if len(raw) <= LIMIT_DIGITS else None


def schema_matches(wanted: str, schema: str) -> bool:
    """Prefix by whole segment: ``promenade`` and ``promenade/Node`` match
    ``promenade/Node/v1``; ``prom`` does not."""
    wanted_parts = wanted.strip("/").split("/")
    return schema.split("/")[: len(wanted_parts)] == wanted_parts


def select(entries: Sequence[Entry], query: DocumentQuery, rendered: bool = False) -> list[Entry]:
    """The entries ``query`` selects, sorted and limited. Rendered documents never include
    abstract ones (they exist to be layered into others, as in Deckhand)."""
    chosen = [e for e in entries if _matches(e, query) and not (rendered and e.document.abstract)]
    chosen.sort(
        key=lambda e: tuple(_sort_value(e, k) for k in query.sort), reverse=query.descending
    )
    return chosen[: query.limit] if query.limit is not None else chosen


def _matches(entry: Entry, query: DocumentQuery) -> bool:
    document = entry.document
    layering = document.layering
    return (
        (not query.schemas or any(schema_matches(s, document.schema) for s in query.schemas))
        and (not query.names or document.name in query.names)
        and all(document.labels.get(k) == v for k, v in query.labels)
        and (not query.buckets or entry.bucket in query.buckets)
        and (not query.abstract or document.abstract in query.abstract)
        and (not query.layers or layering.get("layer") in query.layers)
    )


def _sort_value(entry: Entry, key: str) -> str | int:
    match key:
        case "schema":
            return entry.document.schema
        case "metadata.name":
            return entry.document.name
        case "status.bucket":
            return entry.bucket
        case _:
            return entry.revision


REVISION_SORT_KEYS = {"id": "id", "createdAt": "createdAt", "created_at": "createdAt"}


@dataclass(frozen=True)
class RevisionQuery:
    tags: tuple[str, ...] = ()  # any one of them on the revision (none: every revision)
    sort: tuple[str, ...] = ("id",)  # "id" or "createdAt", the first the most significant
    descending: bool = False


def revision_query(query: Query) -> RevisionQuery:
    """``GET /revisions?tag=&sort=id|createdAt&order=asc|desc``: ``tag`` repeated selects
    the revisions carrying any of them (Deckhand's ``deepfilter`` of a repeated filter),
    ``sort`` repeated sorts by several keys, ``order`` applies to the whole sort (also to
    the default one, oldest first: the API reference's "default is by creation date")."""
    tags: list[str] = []
    orders: list[str] = []
    sort: list[str] = []
    for key, value in query:
        if key == "tag":
            tags.append(value)
        elif key == "order":
            orders.append(value)
        elif key == "sort":
            for name in (k for k in value.split(",") if k):
                if name not in REVISION_SORT_KEYS:
                    raise DocumentsRejected(
                        [f"sort revisions by id or createdAt, not {name[:40]!r}"]
                    )
                sort.append(REVISION_SORT_KEYS[name])
        else:
            raise DocumentsRejected([f"unknown query parameter {key!r} (known: tag, sort, order)"])
    if len(orders) > 1:
        raise DocumentsRejected(["query parameter 'order' is given more than once"])
    descending = _descending(orders[0] if orders else None)
    return RevisionQuery(_distinct(tags), _distinct(sort) or ("id",), descending)
