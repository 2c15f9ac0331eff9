"""The task store's lease on a real database (SQLite file and PostgreSQL): one replica
runs a task at a time, a dead replica's task is taken over once its lease expired, and a
replica that lost the lease writes nothing more (metalmend.drydock.store; docs/destroy.md)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from metalmend.db import Database
from metalmend.drydock.model import Task
from metalmend.drydock.store import TaskStore
from metalmend.policy.destroy import NodeState, Step, TaskStatus

NOW = dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC)
LEASE = dt.timedelta(seconds=30)


@pytest.fixture
def store(database_url: str) -> Iterator[TaskStore]:
    db = Database.open(database_url)
    db.upgrade()
    yield TaskStore(db)
    db.dispose()


def task(task_id: str = "t-1", created: dt.datetime = NOW) -> Task:
    return Task(
        task_id, "destroy_nodes", "http://design", {"filter_set": []}, True,
        TaskStatus.REQUESTED, created, "alice", created, None,
        {"n2": NodeState(), "n1": NodeState()},
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
    store.create(task("new", NOW + dt.timedelta(seconds=1)))
    assert [t.task_id for t in store.newest()] == ["new", "old"]


def test_a_node_is_busy_while_a_task_not_complete_destroys_it(store: TaskStore) -> None:
    store.create(task())
    assert store.busy(["n1", "x"]) == {"n1": "t-1"}
    assert store.take("t-1", "a", NOW, NOW + LEASE)
    assert store.set_status("t-1", "a", TaskStatus.COMPLETE, NOW)
    assert store.busy(["n1"]) == {}
