"""The design store over ``metalmend.db`` (SQLAlchemy Core): puts, revisions, tags, diffs.

Every revision is a full snapshot: one row per document it holds, pointing at the
document's contents, which are stored once however many revisions hold them. A put
copies the other buckets' rows inside the database (``INSERT ... SELECT``) and reads no
document body, so its cost is the bucket's documents, not the site's.

Writers (put, rollback, delete) lock the one row of ``design_counter`` first: on
PostgreSQL ``SELECT ... FOR UPDATE`` makes the others wait for the commit; on SQLite every
write transaction is already ``BEGIN IMMEDIATE``. A revision's number is that row's next
value, so two writers never produce two revisions with one number, and none is lost
(each sees the revision the other committed before it plans). Numbers are never reused,
not even after ``DELETE /revisions``, so an old design reference never names new contents.

Synchronous, as SQLAlchemy is: async endpoints call it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import Database
from metalmend.designs import rules, tables
from metalmend.designs.documents import Document, from_stored
from metalmend.designs.rules import BucketChange, Entry, Placed
from metalmend.errors import Conflict, NotFound

CHUNK = 500  # ids per IN (...): far below every database's limit on bound parameters


@dataclass(frozen=True)
class PutResult:
    revision: int  # the new revision, or the newest one when nothing changed
    created: bool
    entries: tuple[Entry, ...]  # the bucket's documents after the put


@dataclass(frozen=True)
class RevisionSummary:
    id: int
    created_at: dt.datetime
    tags: dict[str, Any] = field(default_factory=dict)  # tag -> data
    buckets: tuple[str, ...] = ()


class DesignStore:
    def __init__(self, database: Database, clock: Clock = SYSTEM_CLOCK) -> None:
        self.database = database
        self.clock = clock

    # --- writes ------------------------------------------------------------------------

    def put(self, bucket: str, documents: Sequence[Document]) -> PutResult:
        """``bucket``'s contents become ``documents``: a new revision, unless the bucket
        already holds exactly these (then the newest revision, ``created`` False)."""
        with self.database.begin() as conn:
            last = _lock(conn)
            head = _newest(conn)
            placed = _placed(conn, head) if head is not None else []
            plan = rules.plan_put(placed, bucket, documents)
            if plan.elsewhere:
                raise Conflict(
                    rules.conflict_message(plan.elsewhere, documents),
                    rules.conflict_lines(plan.elsewhere, bucket),
                )
            if not plan.changed:  # (an empty put into an empty store: revision 0)
                current = head if head is not None else 0
                kept = tuple(Entry(bucket, r or current, d) for d, r in plan.mine)
                return PutResult(current, False, kept)
            revision = self._new_revision(conn, last)
            changed = [d for d, r in plan.mine if r is None]
            ids = _store_contents(conn, changed)
            unchanged = {d.identity for d, r in plan.mine if r is not None}
            if head is not None and len(unchanged) > len(changed):
                # Mostly unchanged: the database copies the whole head, then the bucket's
                # changed and deleted documents are dropped and the changed ones written.
                _copy(conn, head, revision, None)
                gone = [
                    p.identity for p in placed if p.bucket == bucket and p.identity not in unchanged
                ]
                _delete_rows(conn, revision, gone)
                rows = [(bucket, d.schema, d.name, ids[d.digest], revision) for d in changed]
            else:
                if head is not None:
                    _copy(conn, head, revision, bucket)
                with_ids = _content_ids(conn, [d.digest for d, _ in plan.mine], ids)
                rows = [
                    (bucket, d.schema, d.name, with_ids[d.digest], r or revision)
                    for d, r in plan.mine
                ]
            _insert_rows(conn, revision, rows)
            return PutResult(
                revision, True, tuple(Entry(bucket, r or revision, d) for d, r in plan.mine)
            )

    def rollback(self, target: int) -> int:
        """A new revision holding what revision ``target`` held (0: nothing)."""
        with self.database.begin() as conn:
            last = _lock(conn)
            head = _newest(conn)
            if target != 0:
                _must_exist(conn, target)
            wanted = _rows(conn, target) if target != 0 else []
            now = _placed(conn, head) if head is not None else []
            kept = rules.rollback_revisions(now, [placed for placed, _ in wanted])
            revision = self._new_revision(conn, last)
            _insert_rows(conn, revision, [
                (p.bucket, p.identity[0], p.identity[1], content, r or revision)
                for (p, content), r in zip(wanted, kept, strict=True)
            ])  # fmt: skip
            return revision

    def delete_all(self) -> None:
        """Every revision, tag and document gone (numbering goes on where it was)."""
        with self.database.begin() as conn:
            _lock(conn)
            conn.execute(sa.delete(tables.tags))
            conn.execute(sa.delete(tables.revision_documents))
            conn.execute(sa.delete(tables.revisions))
            conn.execute(sa.delete(tables.contents))

    def tag(self, revision: int, tag: str, data: dict[str, Any]) -> None:
        """Tag ``revision`` (again: the data is replaced)."""
        values = {
            "revision_id": revision, "tag": tag, "data": json.dumps(data),
            "created_at": self.clock.now(),
        }  # fmt: skip
        dialect = postgresql if self.database.dialect == "postgresql" else sqlite
        upsert = dialect.insert(tables.tags).values(**values)
        upsert = upsert.on_conflict_do_update(
            index_elements=["revision_id", "tag"],
            set_={"data": upsert.excluded.data, "created_at": upsert.excluded.created_at},
        )
        try:
            with self.database.begin() as conn:
                _must_exist(conn, revision)
                conn.execute(upsert)
        except IntegrityError:  # the revision was deleted meanwhile
            raise NotFound(f"revision {revision} not found") from None

    def delete_tag(self, revision: int, tag: str) -> None:
        with self.database.begin() as conn:
            _must_exist(conn, revision)
            gone = conn.execute(
                sa.delete(tables.tags).where(
                    tables.tags.c.revision_id == revision, tables.tags.c.tag == tag
                )
            )
            if gone.rowcount == 0:
                raise NotFound(f"revision {revision} has no tag {tag!r}")

    def delete_tags(self, revision: int) -> None:
        with self.database.begin() as conn:
            _must_exist(conn, revision)
            conn.execute(sa.delete(tables.tags).where(tables.tags.c.revision_id == revision))

    # --- reads -------------------------------------------------------------------------

    def revisions(self, query: rules.RevisionQuery | None = None) -> list[RevisionSummary]:
        query = query or rules.RevisionQuery()
        with self.database.read() as conn:
            found = conn.execute(
                sa.select(tables.revisions.c.id, tables.revisions.c.created_at)
            ).all()
            tagged = _tags(conn, None)
            buckets = _buckets(conn, None)
        summaries = [
            RevisionSummary(id, _utc(at), tagged.get(id, {}), tuple(buckets.get(id, ())))
            for id, at in found
            if not query.tags or any(t in tagged.get(id, {}) for t in query.tags)
        ]
        summaries.sort(key=lambda s: s.id)  # ties of a sort key: oldest first
        summaries.sort(
            key=lambda s: tuple(s.id if k == "id" else s.created_at for k in query.sort),
            reverse=query.descending,
        )
        return summaries

    def revision(self, revision: int) -> RevisionSummary:
        with self.database.read() as conn:
            at = _must_exist(conn, revision)
            return RevisionSummary(
                revision,
                _utc(at),
                _tags(conn, revision).get(revision, {}),
                tuple(_buckets(conn, revision).get(revision, ())),
            )

    def entries(self, revision: int) -> list[Entry]:
        """The documents of ``revision`` (0: none)."""
        if revision == 0:
            return []
        with self.database.read() as conn:
            _must_exist(conn, revision)
            rows = conn.execute(
                sa.select(
                    tables.revision_documents.c.bucket,
                    tables.revision_documents.c.changed_in,
                    tables.contents.c.body,
                    tables.contents.c.digest,
                )
                .join(
                    tables.contents, tables.contents.c.id == tables.revision_documents.c.content_id
                )
                .where(tables.revision_documents.c.revision_id == revision)
            ).all()
        return [
            Entry(bucket, changed, from_stored(body, digest))
            for bucket, changed, body, digest in rows
        ]

    def tags(self, revision: int) -> dict[str, Any]:
        with self.database.read() as conn:
            _must_exist(conn, revision)
            return _tags(conn, revision).get(revision, {})

    def diff(self, first: int, second: int) -> dict[str, BucketChange]:
        """Per bucket, from the older of the two revisions to the newer (0: empty)."""
        older, newer = sorted((first, second))
        with self.database.read() as conn:
            for revision in (older, newer):
                if revision != 0:
                    _must_exist(conn, revision)
            before = _placed(conn, older) if older else []
            after = _placed(conn, newer) if newer else []
        return rules.bucket_diff(rules.contents_of(before), rules.contents_of(after))

    def newest(self) -> int | None:
        with self.database.read() as conn:
            return _newest(conn)

    def _new_revision(self, conn: Connection, last: int) -> int:
        revision = last + 1
        conn.execute(
            sa.update(tables.counter).where(tables.counter.c.id == 1).values(last_revision=revision)
        )
        conn.execute(sa.insert(tables.revisions).values(id=revision, created_at=self.clock.now()))
        return revision


# --- queries -----------------------------------------------------------------------------


def _lock(conn: Connection) -> int:
    """Take the writers' lock (the counter row); the last revision number given out."""
    found = conn.execute(
        sa.select(tables.counter.c.last_revision).where(tables.counter.c.id == 1).with_for_update()
    ).scalar_one()
    return int(found)


def _newest(conn: Connection) -> int | None:
    found = conn.execute(sa.select(sa.func.max(tables.revisions.c.id))).scalar()
    return int(found) if found is not None else None


def _must_exist(conn: Connection, revision: int) -> dt.datetime:
    at = conn.execute(
        sa.select(tables.revisions.c.created_at).where(tables.revisions.c.id == revision)
    ).scalar()
    if at is None:
        raise NotFound(f"revision {revision} not found")
    return at  # type: ignore[no-any-return]


def _rows(conn: Connection, revision: int) -> list[tuple[Placed, int]]:
    """Where each document of ``revision`` is, and its content id; no body read."""
    rd, contents = tables.revision_documents, tables.contents
    rows = conn.execute(
        sa.select(
            rd.c.bucket, rd.c.schema, rd.c.name, contents.c.digest, rd.c.changed_in, rd.c.content_id
        )
        .join(contents, contents.c.id == rd.c.content_id)
        .where(rd.c.revision_id == revision)
    ).all()
    return [
        (Placed(b, (s, n), digest, changed), content) for b, s, n, digest, changed, content in rows
    ]


def _placed(conn: Connection, revision: int) -> list[Placed]:
    return [placed for placed, _ in _rows(conn, revision)]


def _store_contents(conn: Connection, documents: Sequence[Document]) -> dict[str, int]:
    """Content ids of ``documents``, inserting those never stored (under the lock)."""
    unique = {d.digest: d for d in documents}
    ids = _existing(conn, list(unique))
    missing = [{"digest": k, "body": d.body} for k, d in unique.items() if k not in ids]
    if missing:
        conn.execute(sa.insert(tables.contents), missing)
        ids.update(_existing(conn, [m["digest"] for m in missing]))
    return ids


def _content_ids(conn: Connection, digests: Sequence[str], known: dict[str, int]) -> dict[str, int]:
    wanted = [d for d in set(digests) if d not in known]
    return {**known, **_existing(conn, wanted)}


def _existing(conn: Connection, digests: Sequence[str]) -> dict[str, int]:
    found: dict[str, int] = {}
    for chunk in _chunks(digests):
        rows = conn.execute(
            sa.select(tables.contents.c.digest, tables.contents.c.id).where(
                tables.contents.c.digest.in_(chunk)
            )
        )
        found.update({digest: int(id) for digest, id in rows})
    return found


def _copy(conn: Connection, head: int, revision: int, except_bucket: str | None) -> None:
    """``head``'s rows (but ``except_bucket``'s), copied into ``revision`` by the database."""
    rd = tables.revision_documents
    columns = ("schema", "name", "bucket", "content_id", "changed_in")
    chosen = sa.select(sa.literal(revision, sa.Integer), *(rd.c[c] for c in columns)).where(
        rd.c.revision_id == head
    )
    if except_bucket is not None:
        chosen = chosen.where(rd.c.bucket != except_bucket)
    conn.execute(sa.insert(rd).from_select(["revision_id", *columns], chosen))


def _delete_rows(conn: Connection, revision: int, identities: Sequence[tuple[str, str]]) -> None:
    rd = tables.revision_documents
    if identities:
        conn.execute(
            sa.delete(rd).where(
                rd.c.revision_id == revision,
                rd.c.schema == sa.bindparam("s"),
                rd.c.name == sa.bindparam("n"),
            ),
            [{"s": schema, "n": name} for schema, name in identities],
        )


def _insert_rows(
    conn: Connection, revision: int, rows: Iterable[tuple[str, str, str, int, int]]
) -> None:
    values = [
        {
            "revision_id": revision,
            "bucket": b,
            "schema": s,
            "name": n,
            "content_id": c,
            "changed_in": r,
        }
        for b, s, n, c, r in rows
    ]
    if values:
        conn.execute(sa.insert(tables.revision_documents), values)


def _tags(conn: Connection, revision: int | None) -> dict[int, dict[str, Any]]:
    query = sa.select(tables.tags.c.revision_id, tables.tags.c.tag, tables.tags.c.data).order_by(
        tables.tags.c.revision_id, tables.tags.c.created_at, tables.tags.c.tag
    )
    if revision is not None:
        query = query.where(tables.tags.c.revision_id == revision)
    found: dict[int, dict[str, Any]] = {}
    for rev, tag, data in conn.execute(query):
        found.setdefault(rev, {})[tag] = json.loads(data)
    return found


def _buckets(conn: Connection, revision: int | None) -> dict[int, list[str]]:
    rd = tables.revision_documents
    query = (
        sa.select(rd.c.revision_id, rd.c.bucket).distinct().order_by(rd.c.revision_id, rd.c.bucket)
    )
    if revision is not None:
        query = query.where(rd.c.revision_id == revision)
    found: dict[int, list[str]] = {}
    for rev, bucket in conn.execute(query):
        found.setdefault(rev, []).append(bucket)
    return found


def _chunks(items: Sequence[str]) -> Iterator[Sequence[str]]:
    for start in range(0, len(items), CHUNK):
        yield items[start : start + CHUNK]


def _utc(at: dt.datetime) -> dt.datetime:
    """SQLite gives back naive datetimes; every time stored here is UTC."""
    return at.astimezone(dt.UTC) if at.tzinfo is not None else at.replace(tzinfo=dt.UTC)
