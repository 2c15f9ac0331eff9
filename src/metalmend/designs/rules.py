"""The design store's rules (no I/O): which documents a query selects, how two revisions
differ per bucket, what a put changes. The store (``store.py``) reads and writes; these
decide.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from metalmend.designs.documents import Document, DocumentsRejected, Identity

Query = Sequence[tuple[str, str]]


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


def conflict_lines(elsewhere: Sequence[tuple[Identity, str]], bucket: str) -> list[str]:
    return [
        f"schema {schema} name {name!r} lives in bucket {owner}, not {bucket}: delete it"
        " there first (identity is unique across buckets)"
        for (schema, name), owner in elsewhere
    ]


# --- queries ---------------------------------------------------------------------------

SORT_KEYS = ("schema", "metadata.name", "status.bucket", "status.revision")
DEFAULT_SORT = ("status.bucket", "schema", "metadata.name")
ORDERS = ("asc", "desc")


@dataclass(frozen=True)
class DocumentQuery:
    """``GET /revisions/{id}/documents`` (and ``rendered-documents``)'s filters."""

    schema: str | None = None
    name: str | None = None
    labels: tuple[tuple[str, str], ...] = ()  # all must match
    buckets: tuple[str, ...] = ()  # any may match
    abstract: bool | None = None
    layer: str | None = None
    sort: tuple[str, ...] = DEFAULT_SORT
    descending: bool = False
    limit: int | None = None


DOCUMENT_PARAMETERS = (
    "schema", "metadata.name", "metadata.label", "status.bucket",
    "metadata.layeringDefinition.abstract", "metadata.layeringDefinition.layer",
    "sort", "order", "limit",
)  # fmt: skip
SINGLE = (
    "schema", "metadata.name",
    "metadata.layeringDefinition.abstract", "metadata.layeringDefinition.layer",
)  # fmt: skip
RENDERED_PARAMETERS = tuple(p for p in DOCUMENT_PARAMETERS if "layeringDefinition" not in p)


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
    for single in (*SINGLE, "order", "limit"):
        if len(values.get(single, ())) > 1:
            raise DocumentsRejected([f"query parameter {single!r} is given more than once"])
    return DocumentQuery(
        schema=_one(values, "schema"),
        name=_one(values, "metadata.name"),
        labels=tuple(_label(raw) for raw in values.get("metadata.label", ())),
        buckets=tuple(values.get("status.bucket", ())),
        abstract=_boolean(_one(values, "metadata.layeringDefinition.abstract")),
        layer=_one(values, "metadata.layeringDefinition.layer"),
        sort=_sort(values.get("sort", ())),
        descending=_descending(_one(values, "order")),
        limit=_limit(_one(values, "limit")),
    )


def _one(values: Mapping[str, list[str]], key: str) -> str | None:
    found = values.get(key)
    return found[0] if found else None


def _label(raw: str) -> tuple[str, str]:
    key, equals, value = raw.partition("=")
    if not equals or not key:
        raise DocumentsRejected([f"metadata.label {raw[:80]!r} is not key=value"])
    return key, value


def _boolean(raw: str | None) -> bool | None:
    if raw is None:
        return None
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
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1 or len(raw) > 9:
        raise DocumentsRejected([f"limit is a whole number from 1, not {raw[:20]!r}"])
    return int(raw)


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
        (query.schema is None or schema_matches(query.schema, document.schema))
        and (query.name is None or document.name == query.name)
        and all(document.labels.get(k) == v for k, v in query.labels)
        and (not query.buckets or entry.bucket in query.buckets)
        and (query.abstract is None or document.abstract == query.abstract)
        and (query.layer is None or layering.get("layer") == query.layer)
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


@dataclass(frozen=True)
class RevisionQuery:
    tags: tuple[str, ...] = ()  # every one must be on the revision
    descending: bool = False


def revision_query(query: Query) -> RevisionQuery:
    """``GET /revisions?tag=&sort=id|createdAt&order=asc|desc``."""
    tags: list[str] = []
    order: str | None = None
    for key, value in query:
        if key == "tag":
            tags.append(value)
        elif key == "order":
            order = value
        elif key == "sort":
            if value not in ("id", "createdAt"):  # one order: ids grow with time
                raise DocumentsRejected([f"sort revisions by id or createdAt, not {value[:40]!r}"])
        else:
            raise DocumentsRejected([f"unknown query parameter {key!r} (known: tag, sort, order)"])
    return RevisionQuery(tuple(tags), _descending(order))
