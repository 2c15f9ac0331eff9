"""Which actions the action store lets run side by side, decided in the transaction that
stores one (metalmend.siteactions.store.ActionStore.create; docs/site-actions.md, "Actions
side by side"), on a SQLite file and on PostgreSQL: writers racing with their own engines
(as replicas have) to act on one node store exactly one action, and the others are refused
naming it, with nothing of theirs stored. The policy itself (policy.actions.collision) is
tested table-driven in tests/unit/test_policy_deploysite.py."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from sqlalchemy import text

from metalmend.db import Database
from metalmend.designs.documents import parse
from metalmend.designs.store import DesignStore
from metalmend.errors import Invalid
from metalmend.siteactions import configdocs, model
from metalmend.siteactions import store as action_store
from metalmend.siteactions.policy.actions import (
    ActionLifecycle,
    ActionName,
    Running,
    action_targets,
    collision,
    new_action_id,
)
from metalmend.siteactions.steps import Planned, StepContext
from metalmend.siteactions.store import ActionsCollide, ActionStore

LEASE = dt.timedelta(seconds=30)


async def _step(ctx: StepContext) -> str:
    return "done"


PLAN = (Planned("validation", _step), Planned("relabel", _step))
NODE = (
    "---\nschema: metalmend/KubernetesObject/v1\n"
    "metadata: {schema: metadata/Document/v1, name: node..n1}\n"
    "data: {apiVersion: v1, kind: Node, metadata: {name: n1, labels: {role: worker}}}\n"
)
WITHIN = 120.0  # seconds a wait here may take on a busy machine before it fails


@pytest.fixture
def store(database_url: str) -> Iterator[ActionStore]:
    db = Database.open(database_url)
    db.upgrade()
    yield ActionStore(db)
    db.dispose()


def action(name: str, **parameters: Any) -> model.Action:
    now = dt.datetime.now(dt.UTC)
    return model.Action(
        id=new_action_id(now, os.urandom(10)), name=name, parameters=parameters,
        lifecycle=ActionLifecycle.PENDING, created=now, updated=now, user="tester",
        context_marker=None, committed_rev_id=1, revision=None,
        allow_intermediate_commits=False, steps=(model.Step("a", 0),),
    )  # fmt: skip


def redeploy(*nodes: str) -> model.Action:
    return action("redeploy_server", target_nodes=list(nodes))


def relabel(*nodes: str) -> model.Action:
    return action("relabel_nodes", target_nodes=list(nodes))


def finish(store: ActionStore, action_id: str) -> None:
    now = dt.datetime.now(dt.UTC)
    assert store.leases.take(action_id, "t", now, now + LEASE)
    assert store.set_lifecycle(action_id, "t", ActionLifecycle.FAILED, now)


def race(url: str, made: list[model.Action]) -> list[str]:
    """Each action created at once by a writer of its own: "stored", or the refusal."""
    writers = [Database.open(url) for _ in made]
    writers[0].upgrade()
    start = threading.Barrier(len(writers))

    def create(i: int) -> str:
        start.wait()
        try:
            ActionStore(writers[i]).create(made[i])
        except ActionsCollide as refused:
            return refused.message
        return "stored"

    try:
        with ThreadPoolExecutor(len(writers)) as pool:
            return list(pool.map(create, range(len(writers))))
    finally:
        for db in writers:
            db.dispose()


def test_of_writers_racing_to_act_on_one_node_exactly_one_stores_its_action(
    database_url: str,
) -> None:
    """Issue 36, point 2: five redeploy_server (some with target-revision committed) and
    three relabel_nodes of one node, each writer with its own engine: one stored, seven
    refused naming it and the node, and only the winner stored."""
    made = [
        redeploy("worker-0"),
        redeploy("worker-0", "own-1"),
        action("redeploy_server", target_nodes=["worker-0"], **{"target-revision": "committed"}),
        action("redeploy_server", target_nodes="worker-0", **{"target-revision": "committed"}),
        redeploy("worker-0"),
        relabel("worker-0"),
        relabel("worker-0", "own-2"),
        relabel("worker-0"),
    ]
    outcomes = race(database_url, made)
    assert outcomes.count("stored") == 1, outcomes
    winner = made[outcomes.index("stored")]
    doing = "relabelling" if winner.name == "relabel_nodes" else "redeploying"
    refusals = {o for o in outcomes if o != "stored"}
    assert refusals == {f"action {winner.id} ({winner.name}) is already {doing} worker-0"}
    db = Database.open(database_url)
    try:
        assert [a.id for a in ActionStore(db).newest()] == [winner.id]
    finally:
        db.dispose()


def test_a_create_between_anothers_check_and_its_commit_waits_for_it_and_is_refused(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The interleaving that let every request of a burst through (issue 36, point 2),
    made to happen: writer A has checked and not yet committed when writer B creates an
    action of the same node. B waits for A's transaction (its admission lock not granted,
    as PostgreSQL's pg_locks shows) and is then refused naming A; had B checked before A
    committed, both would be stored."""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite's BEGIN IMMEDIATE already makes every writer wait: no lock to watch")
    first, second = redeploy("n1"), relabel("n1")
    inside, second_checked = threading.Event(), threading.Event()
    watcher, one, two = (Database.open(database_url) for _ in range(3))
    one.upgrade()

    def second_waits() -> bool:
        query = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        with watcher.read() as conn:
            return bool(conn.execute(text(query)).scalar())

    def checked(name: ActionName, targets: Any, running: Any) -> str | None:
        found = collision(name, targets, running)
        if name is not ActionName.REDEPLOY_SERVER:  # the second writer
            second_checked.set()
            return found
        inside.set()  # the first, between its check and its commit: until the second waits
        deadline = time.monotonic() + WITHIN
        while not (second_checked.is_set() or second_waits()):
            assert time.monotonic() < deadline, "the second create neither waited nor checked"
            time.sleep(0.05)
        return found

    monkeypatch.setattr(action_store, "collision", checked)
    try:
        with ThreadPoolExecutor(2) as pool:
            stored = pool.submit(ActionStore(one).create, first)
            assert inside.wait(WITHIN), "the first create never reached its check"
            refused = pool.submit(ActionStore(two).create, second)
            stored.result(WITHIN)
            with pytest.raises(ActionsCollide) as raised:
                refused.result(WITHIN)
        words = f"action {first.id} (redeploy_server) is already redeploying n1"
        assert raised.value.message == words
        assert [a.id for a in ActionStore(watcher).newest()] == [first.id]
    finally:
        for db in (watcher, one, two):
            db.dispose()


def test_of_writers_racing_with_a_site_action_what_is_stored_never_collides(
    database_url: str,
) -> None:
    """A deploy_site and an update_site (each runs alone) racing redeploys of different
    nodes and of one shared node: whatever wins, no two actions stored may run side by
    side, and each refusal names an action that was stored."""
    made = [
        action("deploy_site"),
        redeploy("a"),
        redeploy("b"),
        action("update_site"),
        relabel("c"),
        redeploy("c", "d"),
    ]
    outcomes = race(database_url, made)
    stored = [a for a, o in zip(made, outcomes, strict=True) if o == "stored"]
    assert stored, outcomes
    for one, other in itertools.permutations(stored, 2):
        running = Running(
            other.id, other.name, frozenset(action_targets(other.name, other.parameters))
        )
        assert (
            collision(ActionName(one.name), action_targets(one.name, one.parameters), [running])
            is None
        )
    ids = {a.id for a in stored}
    for refusal in (o for o in outcomes if o != "stored"):
        assert any(f"action {i} " in refusal for i in ids), (refusal, ids)
    db = Database.open(database_url)
    try:
        assert {a.id for a in ActionStore(db).newest()} == ids
    finally:
        db.dispose()


def test_an_action_holds_its_nodes_until_it_is_finished(store: ActionStore) -> None:
    first = redeploy("n1", "n2")
    store.create(first)
    store.create(redeploy("n3"))  # another node: side by side
    for refused, words in (
        (redeploy("n2"), f"action {first.id} (redeploy_server) is already redeploying n2"),
        (relabel("n1", "n4"), f"action {first.id} (redeploy_server) is already redeploying n1"),
        (action("deploy_site"), f"action {first.id} (redeploy_server) is running"),
    ):
        with pytest.raises(ActionsCollide) as raised:
            store.create(refused)
        assert raised.value.message.startswith(words), raised.value.message
        assert store.get(refused.id) is None  # nothing of it stored
    finish(store, first.id)
    again = redeploy("n2")
    store.create(again)  # failed: its nodes are free
    assert store.get(again.id) is not None


def test_a_site_action_runs_alone(store: ActionStore) -> None:
    site = action("update_site")
    store.create(site)
    with pytest.raises(ActionsCollide, match=f"action {site.id} \\(update_site\\) is running"):
        store.create(redeploy("n1"))
    finish(store, site.id)
    store.create(redeploy("n1"))
    with pytest.raises(ActionsCollide, match="deploy_site waits until it ends"):
        store.create(action("deploy_site"))


class Fixed:
    def __init__(self, at: dt.datetime) -> None:
        self.at = at

    def now(self) -> dt.datetime:
        return self.at


def test_admission_checks_the_design_store_then_stores_the_action_by_its_plan(
    store: ActionStore,
) -> None:
    """configdocs.Admission, passed the action store, a clock and the plans (no router):
    relabel_nodes needs a committed revision; once there is one the action is stored with
    its plan's steps, its creator and the committed revision; a second of the same node
    is refused by the store."""
    designs = DesignStore(store.db)
    at = dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC)
    admission = configdocs.Admission(store, {"relabel_nodes": PLAN}, Fixed(at))
    asked = configdocs.ActionRequest(
        ActionName.RELABEL_NODES, {"target_nodes": ["n1"]}, False, "alice",
        {"username": "alice", "uid": "u-1", "groups": [], "extra": {}}, "marker",
    )  # fmt: skip
    with pytest.raises(Invalid, match="relabel_nodes needs committed configdocs"):
        admission.create(designs, asked)
    assert store.newest() == []
    revision = configdocs.put_in_buffer(designs, "site", parse(NODE), "rejectoncontents")
    designs.tag(revision, "committed", {})
    action, skipped = admission.create(designs, asked)
    assert skipped is None
    found = store.get(action.id)
    assert found is not None
    assert (found.name, found.committed_rev_id, found.created, found.user) == (
        "relabel_nodes", revision, at, "alice",
    )  # fmt: skip
    assert [s.name for s in found.steps] == [p.name for p in PLAN]
    assert found.caller == asked.caller
    with pytest.raises(ActionsCollide, match=f"action {action.id} \\(relabel_nodes\\)"):
        admission.create(designs, asked)
