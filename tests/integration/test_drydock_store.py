"""The task store's lease on a real database (SQLite file and PostgreSQL): one replica
runs a task at a time, a dead replica's task is taken over once its lease expired, and a
replica that lost the lease writes nothing more; one task per node at a time, whatever the
number of writers racing (metalmend.destroy.store; docs/destroy.md)."""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from metalmend.db import Database, metadata, migrate
from metalmend.destroy.model import Task
from metalmend.destroy.policy.destroy import NodeState, Step, TaskStatus
from metalmend.destroy.store import NodesBusy, TaskStore

NOW = dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC)
LEASE = dt.timedelta(seconds=30)


@pytest.fixture
def store(database_url: str) -> Iterator[TaskStore]:
    db = Database.open(database_url)
    db.upgrade()
    yield TaskStore(db)
    db.dispose()


def task(
    task_id: str = "t-1", created: dt.datetime = NOW, nodes: tuple[str, ...] = ("n2", "n1")
) -> Task:
    return Task(
        task_id, "destroy_nodes", "http://design", {"filter_set": []}, True,
        TaskStatus.REQUESTED, created, "alice", created, None,
        {n: NodeState() for n in nodes},
    )  # fmt: skip


def test_a_task_reads_back_as_stored_with_its_nodes_in_the_requests_order(
    store: TaskStore,
) -> None:
    store.create(task())
    found = store.get("t-1")
    assert found is not None
    assert (found.created, found.preserve_local_storage, list(found.nodes)) == (
        NOW,
        True,
        ["n2", "n1"],
    )
    assert store.get("other") is None


def test_of_replicas_racing_for_a_task_exactly_one_takes_it(store: TaskStore) -> None:
    store.create(task())
    with ThreadPoolExecutor(8) as pool:
        won = list(pool.map(lambda i: store.take("t-1", f"r{i}", NOW, NOW + LEASE), range(8)))
    assert won.count(True) == 1
    assert store.runnable(NOW) == []


def test_a_dead_replicas_task_is_taken_over_once_its_lease_expired(store: TaskStore) -> None:
    store.create(task())
    assert store.take("t-1", "a", NOW, NOW + LEASE)
    assert not store.take("t-1", "b", NOW + LEASE / 2, NOW + LEASE)
    later = NOW + LEASE + dt.timedelta(seconds=1)
    assert store.runnable(later) == ["t-1"]
    assert store.take("t-1", "b", later, later + LEASE)
    # a lost lease: no renewal, no write of a node's record, no status
    assert not store.renew("t-1", "a", later + LEASE)
    assert not store.save_node("t-1", "a", "n1", NodeState(step=Step.WIPE), later)
    assert not store.set_status("t-1", "a", TaskStatus.COMPLETE, later)
    assert store.save_node("t-1", "b", "n1", NodeState(step=Step.WIPE), later)
    found = store.get("t-1")
    assert found is not None
    assert found.nodes["n1"].step is Step.WIPE


def test_a_complete_task_is_never_taken_again(store: TaskStore) -> None:
    store.create(task())
    assert store.take("t-1", "a", NOW, NOW + LEASE)
    assert store.set_status("t-1", "a", TaskStatus.COMPLETE, NOW)
    assert not store.take("t-1", "a", NOW, NOW + LEASE)
    assert store.runnable(NOW + 10 * LEASE) == []


def test_tasks_are_listed_newest_first(store: TaskStore) -> None:
    store.create(task("old", NOW))
    store.create(task("new", NOW + dt.timedelta(seconds=1), nodes=("n3",)))
    assert [t.task_id for t in store.newest()] == ["new", "old"]


def test_a_node_is_busy_while_a_task_not_complete_destroys_it(store: TaskStore) -> None:
    store.create(task())
    assert store.busy(["n1", "x"]) == {"n1": "t-1"}
    assert store.take("t-1", "a", NOW, NOW + LEASE)
    assert store.set_status("t-1", "a", TaskStatus.COMPLETE, NOW)
    assert store.busy(["n1"]) == {}


def test_of_writers_racing_to_destroy_one_node_exactly_one_stores_its_task(
    database_url: str,
) -> None:
    """Eight writers, each with its own engine (its own connections, as replicas have),
    create a task for the same node at once: the database stores one, refuses the others
    naming it, and stores nothing of theirs."""
    writers = [Database.open(database_url) for _ in range(8)]
    writers[0].upgrade()
    start = threading.Barrier(len(writers))

    def create(i: int) -> str:
        start.wait()
        try:
            TaskStore(writers[i]).create(task(f"t-{i}", nodes=("n1", f"own-{i}")))
        except NodesBusy as busy:
            return busy.message
        return "stored"

    try:
        with ThreadPoolExecutor(len(writers)) as pool:
            outcomes = list(pool.map(create, range(len(writers))))
        store = TaskStore(writers[0])
        assert outcomes.count("stored") == 1, outcomes
        winner = f"t-{outcomes.index('stored')}"
        refusals = {o for o in outcomes if o != "stored"}
        assert refusals == {f"Node n1 is being destroyed by task {winner}"}
        assert [t.task_id for t in store.newest()] == [winner]
        own = [f"own-{i}" for i in range(len(writers))]
        assert store.busy(["n1", *own]) == {"n1": winner, f"own-{winner[2:]}": winner}
    finally:
        for db in writers:
            db.dispose()


def test_a_node_is_free_once_its_record_is_finished_while_its_task_goes_on(
    store: TaskStore,
) -> None:
    store.create(task())
    assert store.take("t-1", "a", NOW, NOW + LEASE)
    with pytest.raises(NodesBusy, match="Node n1 is being destroyed by task t-1"):
        store.create(task("t-2", nodes=("n1",)))
    failed = NodeState().fail(NOW, "wipe: drives NOT wiped")
    assert store.save_node("t-1", "a", "n1", failed, NOW)
    assert store.busy(["n1", "n2"]) == {"n2": "t-1"}
    store.create(task("t-2", nodes=("n1",)))  # n1 again, while t-1 still destroys n2
    assert store.busy(["n1", "n2"]) == {"n1": "t-2", "n2": "t-1"}


def test_a_dead_replicas_task_keeps_its_nodes_claimed_while_another_takes_it_over(
    store: TaskStore,
) -> None:
    store.create(task())
    assert store.take("t-1", "a", NOW, NOW + LEASE)  # then "a" dies
    later = NOW + 2 * LEASE
    assert store.busy(["n1"]) == {"n1": "t-1"}
    assert store.take("t-1", "b", later, later + LEASE)
    assert store.set_status("t-1", "b", TaskStatus.COMPLETE, later)
    assert store.busy(["n1", "n2"]) == {}


def test_the_upgrade_claims_the_nodes_of_tasks_not_complete_the_oldest_first(
    database_url: str,
) -> None:
    db = Database.open(database_url)
    try:
        migrate.upgrade(db, "0003_actions")
        tasks = [  # two tasks of n1 already running (what the race allowed), one complete
            ("old", "running", NOW, ["n1"]),
            ("new", "requested", NOW + LEASE, ["n1", "n2"]),
            ("done", "complete", NOW - LEASE, ["n3"]),
        ]
        with db.begin() as conn:
            for task_id, status, created, nodes in tasks:
                at = created.replace(tzinfo=None)
                conn.execute(
                    sa.text(
                        "INSERT INTO drydock_tasks (task_id, action, design_ref,"
                        " preserve_local_storage, status, created, created_by, updated)"
                        " VALUES (:t, 'destroy_nodes', 'x', false, :s, :c, 'alice', :c)"
                    ),
                    {"t": task_id, "s": status, "c": at},
                )
                for node in nodes:
                    conn.execute(
                        sa.text(
                            "INSERT INTO drydock_task_nodes (task_id, node, position, state,"
                            " updated) VALUES (:t, :n, 0, '{}', :c)"
                        ),
                        {"t": task_id, "n": node, "c": at},
                    )
        db.upgrade()
        assert TaskStore(db).busy(["n1", "n2", "n3"]) == {"n1": "old", "n2": "new"}
    finally:
        db.dispose()


def test_the_migrations_create_exactly_the_claims_and_identity_tables_the_code_queries(
    store: TaskStore,
) -> None:
    with store.db.read() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)
    ours = ("drydock_node_claims", "store_identity", "ix_drydock_node_claims")
    assert [d for d in differences if any(name in repr(d) for name in ours)] == []
    assert migrate.current(store.db) == migrate.head()
