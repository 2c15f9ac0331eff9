"""The design store against real databases, each test once on a SQLite file and once on a
fresh database of a throwaway PostgreSQL cluster (``database_url``, tests/postgres.py):
numbering, idempotent puts, buckets, tags, diffs, rollback; concurrent writers (threads
and processes) and a writer killed inside its transaction."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from metalmend.db import Database, DatabaseError, metadata, migrate
from metalmend.designs import tables
from metalmend.designs.documents import Document, parse
from metalmend.designs.rules import BucketChange, RevisionQuery
from metalmend.designs.store import DesignStore
from metalmend.errors import Conflict, NotFound


def doc(name: str, value: object = 1, schema: str = "promenade/Node/v1") -> str:
    return (
        f"---\nschema: {schema}\nmetadata: {{schema: metadata/Document/v1, name: {name}}}\n"
        f"data: {{value: {value}}}\n"
    )


def docs(*names: str, value: object = 1) -> list[Document]:
    return parse("".join(doc(n, value) for n in names))


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database.open(database_url)
    db.upgrade()
    yield db
    db.dispose()


@pytest.fixture
def store(database: Database) -> DesignStore:
    return DesignStore(database)


def revision_ids(store: DesignStore) -> list[int]:
    return [r.id for r in store.revisions()]


# ---- schema -------------------------------------------------------------------------------


def table_of(difference: Any) -> str:
    """The table an Alembic comparison result is about (other stores' tables are theirs)."""
    if isinstance(difference, list):  # column changes come grouped
        return table_of(difference[0])
    for item in difference[1:]:
        if isinstance(item, sa.Table):
            return item.name
        if isinstance(item, sa.Index | sa.UniqueConstraint | sa.ForeignKeyConstraint):
            return item.table.name if item.table is not None else ""
        if isinstance(item, str) and item.startswith(("design_", "drydock_", "shipyard_")):
            return item
    return repr(difference)


def test_the_migrations_create_exactly_the_tables_the_code_queries(database: Database) -> None:
    assert tables.revisions.metadata is metadata
    with database.read() as conn:
        context = MigrationContext.configure(conn)
        differences = compare_metadata(context, metadata)
    ours = [d for d in differences if table_of(d).startswith("design_")]
    assert ours == []
    assert migrate.current(database) == migrate.head()


def test_upgrading_again_changes_nothing(database: Database, store: DesignStore) -> None:
    store.put("site", docs("a"))
    database.upgrade()
    assert revision_ids(store) == [1]


def upgrade(url: str) -> str | None:
    db = Database.open(url)
    try:
        db.upgrade()
        return migrate.current(db)
    finally:
        db.dispose()


def test_replicas_starting_together_upgrade_one_at_a_time(database_url: str) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(3) as pool:
        assert pool.map(upgrade, [database_url] * 3) == [migrate.head()] * 3


def open_and_write(path: str) -> str:
    db = Database.open(f"sqlite:///{path}")
    try:
        with db.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS t (x INTEGER)")
        return "ok"
    except Exception as error:
        return repr(error)
    finally:
        db.dispose()


def test_replicas_opening_a_new_sqlite_file_together_all_get_it(tmp_path: Any) -> None:
    """Three processes opening one new file at once all switch it to WAL: SQLite refuses the
    switch at once (no busy wait) to all but one of them, who must try again. Before that
    retry, about 1 in 10 of these rounds failed one replica with "database is locked"."""
    context = multiprocessing.get_context("forkserver")
    with context.Pool(3) as pool:
        for round in range(60):
            path = str(tmp_path / f"store-{round}.sqlite")
            assert pool.map(open_and_write, [path] * 3) == ["ok"] * 3, f"round {round}"


def test_a_database_that_cannot_be_opened_says_so_in_one_line(tmp_path: object) -> None:
    with pytest.raises(DatabaseError, match="not supported"):
        Database.open("mysql://user@host/db")
    with pytest.raises(DatabaseError, match="must be a file"):
        Database.open("sqlite://")
    unreachable = Database.open("postgresql+psycopg://u:secret@127.0.0.1:1/db")
    with pytest.raises(DatabaseError) as caught:
        unreachable.upgrade()
    assert "secret" not in str(caught.value)
    assert "\n" not in str(caught.value)


# ---- puts and numbering ---------------------------------------------------------------


def test_each_change_is_the_next_revision_and_an_unchanged_put_is_none(store: DesignStore) -> None:
    first = store.put("site", docs("a", "b"))
    again = store.put("site", docs("b", "a"))
    other = store.put("global", docs("g"))
    changed = store.put("site", docs("a", "b", value=2))
    assert [(r.revision, r.created) for r in (first, again, other, changed)] == [
        (1, True), (1, False), (2, True), (3, True),
    ]  # fmt: skip
    assert revision_ids(store) == [1, 2, 3]


def test_documents_carry_the_revision_where_they_last_changed(store: DesignStore) -> None:
    store.put("site", docs("a", "b"))
    store.put("global", docs("g"))
    store.put("site", parse(doc("a") + doc("b", 2)))
    found = {(e.bucket, e.document.name): e.revision for e in store.entries(3)}
    assert found == {("site", "a"): 1, ("site", "b"): 3, ("global", "g"): 2}


def test_a_put_changing_a_few_documents_keeps_the_others_and_their_revisions(
    store: DesignStore,
) -> None:
    store.put("site", docs("a", "b", "c", "d", "e"))
    store.put("global", docs("g"))
    store.put("site", parse(doc("a") + doc("b") + doc("c") + doc("d", 2) + doc("f")))
    found = {(e.bucket, e.document.name): (e.revision, e.document.data) for e in store.entries(3)}
    assert found == {
        ("site", "a"): (1, {"value": 1}), ("site", "b"): (1, {"value": 1}),
        ("site", "c"): (1, {"value": 1}), ("site", "d"): (3, {"value": 2}),
        ("site", "f"): (3, {"value": 1}), ("global", "g"): (2, {"value": 1}),
    }  # fmt: skip
    assert store.diff(2, 3) == {"global": BucketChange.UNMODIFIED, "site": BucketChange.MODIFIED}


def test_a_document_left_out_of_a_put_is_deleted_and_an_empty_put_empties_the_bucket(
    store: DesignStore,
) -> None:
    store.put("site", docs("a", "b"))
    store.put("site", docs("a"))
    assert [e.document.name for e in store.entries(2)] == ["a"]
    emptied = store.put("site", [])
    assert (emptied.revision, emptied.created, store.entries(3)) == (3, True, [])
    assert store.revision(3).buckets == ()
    assert store.put("site", []).created is False


def test_a_document_of_another_bucket_is_a_conflict_and_nothing_is_stored(
    store: DesignStore,
) -> None:
    store.put("global", docs("shared"))
    with pytest.raises(Conflict) as caught:
        store.put("site", docs("mine", "shared"))
    assert "lives in bucket global" in caught.value.problems[0]
    assert caught.value.message == (
        "Document [promenade/Node/v1, None] shared already exists in bucket: global"
    )
    assert revision_ids(store) == [1]
    # As Deckhand's own test: once deleted from its bucket, it may be put in another.
    store.put("global", [])
    moved = store.put("site", docs("shared"))
    assert (moved.revision, [e.bucket for e in store.entries(moved.revision)]) == (3, ["site"])


def test_contents_are_stored_once_however_many_revisions_hold_them(
    store: DesignStore, database: Database
) -> None:
    store.put("site", docs("a", "b", "c"))
    for value in range(2, 6):
        store.put("other", docs("x", value=value))
    with database.read() as conn:
        count = conn.execute(sa.select(sa.func.count()).select_from(tables.contents)).scalar()
    assert count == 3 + 4


# ---- tags ---------------------------------------------------------------------------------


def test_a_revision_carries_several_tags_and_re_tagging_replaces_the_data(
    store: DesignStore,
) -> None:
    store.put("site", docs("a"))
    store.put("site", docs("b"))
    store.tag(1, "committed", {"by": "alice"})
    store.tag(1, "site-action-success", {})
    store.tag(1, "committed", {"by": "bob"})
    store.tag(2, "committed", {})
    assert store.tags(1) == {"committed": {"by": "bob"}, "site-action-success": {}}
    tagged = store.revisions(RevisionQuery(("committed",), descending=True))
    assert [r.id for r in tagged] == [2, 1]


def test_revisions_by_tags_any_of_them_sorted_by_id_or_creation(
    store: DesignStore, database: Database
) -> None:
    for name in "abcd":
        store.put("site", docs(name))
    store.tag(1, "foo", {})
    store.tag(1, "bar", {})
    store.tag(3, "bar", {})
    # Deckhand's deepfilter: repeated tags select revisions carrying any of them.
    assert [r.id for r in store.revisions(RevisionQuery(("foo",)))] == [1]
    assert [r.id for r in store.revisions(RevisionQuery(("foo", "bar")))] == [1, 3]
    assert [r.id for r in store.revisions(RevisionQuery(("baz",)))] == []
    assert [r.id for r in store.revisions(RevisionQuery(descending=True))] == [4, 3, 2, 1]
    # createdAt is the time each was made, even when a clock made them out of id order.
    with database.begin() as conn:
        for revision, day in ((1, 4), (2, 2), (3, 3), (4, 1)):
            conn.execute(
                sa.update(tables.revisions)
                .where(tables.revisions.c.id == revision)
                .values(created_at=dt.datetime(2026, 1, day, tzinfo=dt.UTC))
            )
    assert [r.id for r in store.revisions(RevisionQuery(sort=("createdAt",)))] == [4, 2, 3, 1]
    by_created = RevisionQuery(("bar",), ("createdAt", "id"), descending=True)
    assert [r.id for r in store.revisions(by_created)] == [1, 3]


def test_tags_are_deleted_one_or_all(store: DesignStore) -> None:
    store.put("site", docs("a"))
    store.tag(1, "a", {})
    store.tag(1, "b", {})
    store.delete_tag(1, "a")
    assert list(store.tags(1)) == ["b"]
    with pytest.raises(NotFound):
        store.delete_tag(1, "a")
    store.delete_tags(1)
    assert store.tags(1) == {}


def test_an_unknown_revision_is_not_found(store: DesignStore) -> None:
    for call in (
        lambda: store.revision(7), lambda: store.entries(7), lambda: store.tag(7, "t", {}),
        lambda: store.tags(7), lambda: store.diff(0, 7), lambda: store.rollback(7),
    ):  # fmt: skip
        with pytest.raises(NotFound, match="revision 7 not found"):
            call()


# ---- diffs, rollback, deletion ------------------------------------------------------------


def test_the_diff_is_per_bucket_whatever_order_the_revisions_are_named_in(
    store: DesignStore,
) -> None:
    store.put("kept", docs("k"))
    store.put("changed", docs("c"))
    store.put("gone", docs("g"))
    store.put("changed", docs("c", value=2))  # 4
    store.put("gone", [])  # 5
    store.put("new", docs("n"))  # 6
    expected = {
        "changed": BucketChange.MODIFIED, "gone": BucketChange.DELETED,
        "kept": BucketChange.UNMODIFIED, "new": BucketChange.CREATED,
    }  # fmt: skip
    assert store.diff(3, 6) == store.diff(6, 3) == expected
    assert store.diff(0, 3) == {b: BucketChange.CREATED for b in ("changed", "gone", "kept")}
    assert store.diff(6, 6) == {b: BucketChange.UNMODIFIED for b in ("changed", "kept", "new")}


def test_a_rollback_is_a_new_revision_holding_the_old_contents(store: DesignStore) -> None:
    store.put("site", docs("a", "b"))
    store.put("site", docs("a", value=2))
    assert store.rollback(1) == 3
    assert store.diff(1, 3) == {"site": BucketChange.UNMODIFIED}
    assert {e.document.name: e.revision for e in store.entries(3)} == {"a": 3, "b": 3}
    assert store.rollback(0) == 4
    assert store.entries(4) == []


def test_deleting_every_revision_never_reuses_a_number(store: DesignStore) -> None:
    store.put("site", docs("a"))
    store.put("site", docs("b"))
    store.tag(2, "committed", {})
    store.delete_all()
    assert store.revisions() == []
    assert store.put("site", docs("a")).revision == 3


# ---- concurrent writers -------------------------------------------------------------------

WRITERS = 6
PUTS = 5


def write(url: str, writer: int) -> list[int]:
    """``PUTS`` changes: to the writer's own bucket and to one all writers share."""
    db = Database.open(url)
    store = DesignStore(db)
    made = []
    try:
        for n in range(PUTS):
            made.append(store.put(f"own-{writer}", docs(f"w{writer}", value=n)).revision)
            made.append(store.put("shared", docs(f"shared-{writer}", value=n)).revision)
    finally:
        db.dispose()
    return made


def check_no_revision_lost(store: DesignStore, made: list[int]) -> None:
    total = WRITERS * PUTS * 2
    assert sorted(made) == list(range(1, total + 1))  # every put its own number, no gap
    assert revision_ids(store) == list(range(1, total + 1))
    newest = {e.bucket: e.document.data for e in store.entries(total)}
    assert {b: v for b, v in newest.items() if b.startswith("own-")} == {
        f"own-{w}": {"value": PUTS - 1} for w in range(WRITERS)
    }


def test_concurrent_threads_never_lose_a_revision_nor_share_a_number(
    store: DesignStore, database_url: str
) -> None:
    with ThreadPoolExecutor(WRITERS) as pool:
        results = list(pool.map(lambda w: write(database_url, w), range(WRITERS)))
    check_no_revision_lost(store, [r for made in results for r in made])


def test_concurrent_processes_never_lose_a_revision_nor_share_a_number(
    store: DesignStore, database_url: str
) -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(WRITERS) as pool:
        results = pool.starmap(write, [(database_url, w) for w in range(WRITERS)])
    check_no_revision_lost(store, [r for made in results for r in made])


def hold_the_lock_half_written(url: str, ready: multiprocessing.synchronize.Event) -> None:
    """A writer stopped inside its transaction: revision 2's row written, not committed."""
    db = Database.open(url)
    with db.begin() as conn:
        last = conn.execute(
            sa.select(tables.counter.c.last_revision).with_for_update()
        ).scalar_one()
        conn.execute(sa.update(tables.counter).values(last_revision=last + 1))
        conn.execute(sa.insert(tables.revisions).values(id=last + 1, created_at=sa.func.now()))
        ready.set()
        threading.Event().wait(120)  # killed here


def test_a_writer_killed_inside_its_transaction_leaves_no_trace(
    store: DesignStore, database_url: str
) -> None:
    store.put("site", docs("a"))
    context = multiprocessing.get_context("spawn")
    ready = context.Event()
    child = context.Process(target=hold_the_lock_half_written, args=(database_url, ready))
    child.start()
    try:
        assert ready.wait(60)
        os.kill(child.pid or 0, signal.SIGKILL)
    finally:
        child.join(30)
    assert store.put("site", docs("b")).revision == 2  # the killed writer's number is free
    assert revision_ids(store) == [1, 2]
