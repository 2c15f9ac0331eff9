"""The action worker (siteactions.worker) over the action store, on a SQLite file and on
PostgreSQL: steps in order, records kept across a kill, a failure's remaining steps not
run but the final one, a stop between steps, and two replicas running each action once.

The steps here are plain functions that count their runs: what is tested is the worker's
bookkeeping; the real steps are tested against the API server in their own files."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import inspect
from sqlalchemy.engine import Inspector

from metalmend.db import Database
from metalmend.siteactions import model
from metalmend.siteactions.policy.actions import ActionLifecycle, new_action_id
from metalmend.siteactions.steps import MissingPrecondition, Planned, StepContext, StepFailed
from metalmend.siteactions.store import ActionStore
from metalmend.siteactions.worker import ActionWorker
from tests.support import until

LEASE = 1.5  # seconds: short, so that a takeover after a kill is quick


@pytest.fixture
def database(database_url: str) -> Iterator[Database]:
    db = Database.open(database_url)
    db.upgrade()
    yield db
    db.dispose()


def new_action(store: ActionStore, steps: tuple[str, ...], name: str = "redeploy_server") -> str:
    """A pending action of ``steps`` on a node of its own (two actions of one node are
    refused: tests/integration/test_shipyard_store.py)."""
    now = dt.datetime.now(dt.UTC)
    action_id = new_action_id(now, os.urandom(10))
    action = model.Action(
        id=action_id, name=name, parameters={"target_nodes": [f"n-{action_id.lower()}"]},
        lifecycle=ActionLifecycle.PENDING, created=now, updated=now, user="tester",
        context_marker=None, committed_rev_id=3, revision=None, allow_intermediate_commits=False,
        steps=tuple(model.Step(s, i) for i, s in enumerate(steps)),
    )  # fmt: skip
    store.create(action)
    return action.id


class Steps:
    """Steps that count their runs; ``block`` makes one wait until released."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.records: dict[str, dict[str, Any]] = {}
        self.block: dict[str, asyncio.Event] = {}
        self.started: dict[str, asyncio.Event] = {}

    def ok(self, name: str) -> Planned:
        async def run(ctx: StepContext) -> str:
            self.runs[name] = self.runs.get(name, 0) + 1
            self.records[name] = dict(ctx.record)
            self.started.setdefault(name, asyncio.Event()).set()
            await ctx.note(f"{name} working (run {self.runs[name]})")
            if "half" not in ctx.record:
                await ctx.save({"half": True})
            if name in self.block:
                await self.block[name].wait()
            return f"{name} done"

        return Planned(name, run)

    def failing(self, name: str, error: Exception) -> Planned:
        async def run(ctx: StepContext) -> str:
            self.runs[name] = self.runs.get(name, 0) + 1
            raise error

        return Planned(name, run)

    def final(self, name: str) -> Planned:
        async def run(ctx: StepContext) -> str:
            self.runs[name] = self.runs.get(name, 0) + 1
            return f"states: {dict(ctx.action.states)}"

        return Planned(name, run, final=True)


async def finished(store: ActionStore, action_id: str, within: float = 20) -> model.Action:
    """The action once it finished (the wait stretched by the machine's load, as every wait
    of the suite: tests/support.py)."""

    def ended() -> bool:
        found = store.get(action_id)
        assert found is not None
        return found.finished

    await until(ended, within, what=f"action {action_id} finished")
    found = store.get(action_id)
    assert found is not None
    return found


def worker(store: ActionStore, plan: tuple[Planned, ...], owner: str) -> ActionWorker:
    plans = {"redeploy_server": plan, "deploy_site": plan}
    return ActionWorker(store, None, LEASE, steps=plans, owner=owner, retry_seconds=0.05)


async def run_alone(store: ActionStore, plan: tuple[Planned, ...], action_id: str) -> model.Action:
    """The action run to its end by one worker, stopped afterwards."""
    running = worker(store, plan, "one")
    running.start()
    try:
        return await finished(store, action_id)
    finally:
        await running.stop()


def test_the_migration_creates_the_tables_the_store_uses(database: Database) -> None:
    found: Inspector = inspect(database.engine)
    assert {"shipyard_actions", "shipyard_action_steps"} <= set(found.get_table_names())


async def test_steps_run_in_order_and_the_action_completes(database: Database) -> None:
    store, steps = ActionStore(database), Steps()
    plan = (steps.ok("a"), steps.ok("b"), steps.final("tag"))
    action_id = new_action(store, ("a", "b", "tag"))
    done = await run_alone(store, plan, action_id)
    assert done.lifecycle is ActionLifecycle.COMPLETE
    assert [(s.name, s.state, s.try_number) for s in done.steps] == [
        ("a", model.StepState.SUCCESS, 1), ("b", model.StepState.SUCCESS, 1),
        ("tag", model.StepState.SUCCESS, 1),
    ]  # fmt: skip
    assert [n.text for n in done.steps[0].notes] == ["a working (run 1)", "a done"]
    assert "'a': 'success', 'b': 'success'" in done.steps[2].notes[-1].text
    assert all(s.start and s.end and s.start <= s.end for s in done.steps)
    wire = done.to_wire(f"/actions/{done.id}")
    assert (wire["action_lifecycle"], wire["dag_status"]) == ("Complete", "success")
    assert [s["state"] for s in wire["steps"]] == ["success"] * 3


async def test_a_failed_step_skips_the_rest_but_the_final_one(database: Database) -> None:
    store, steps = ActionStore(database), Steps()
    plan = (
        steps.ok("a"), steps.failing("b", StepFailed("no host")), steps.ok("c"), steps.final("tag"),
    )  # fmt: skip
    action_id = new_action(store, ("a", "b", "c", "tag"))
    done = await run_alone(store, plan, action_id)
    assert done.lifecycle is ActionLifecycle.FAILED
    states = {s.name: s.state for s in done.steps}
    assert states == {
        "a": model.StepState.SUCCESS, "b": model.StepState.FAILED,
        "c": model.StepState.NOT_RUN, "tag": model.StepState.SUCCESS,
    }  # fmt: skip
    assert done.step("b").notes[-1].text == "no host"  # type: ignore[union-attr]
    assert "c" not in steps.runs


async def test_a_missing_precondition_says_so(database: Database) -> None:
    store, steps = ActionStore(database), Steps()
    plan = (steps.failing("lookup", MissingPrecondition("no revision is tagged x")),)
    action_id = new_action(store, ("lookup",))
    done = await run_alone(store, plan, action_id)
    assert done.steps[0].notes[-1].text == "missing precondition: no revision is tagged x"


async def test_an_unexpected_error_is_tried_again_then_fails_the_step(database: Database) -> None:
    store, steps = ActionStore(database), Steps()
    plan = (steps.failing("a", RuntimeError("bug")),)
    action_id = new_action(store, ("a",))
    done = await run_alone(store, plan, action_id)
    assert steps.runs["a"] == 10
    assert done.steps[0].notes[-1].text == "metalmend serve failed: RuntimeError (10 times)"


async def test_killed_mid_step_another_replica_resumes_it_from_its_record(
    database: Database,
) -> None:
    store, steps = ActionStore(database), Steps()
    steps.block["b"] = asyncio.Event()
    plan = (steps.ok("a"), steps.ok("b"), steps.final("tag"))
    action_id = new_action(store, ("a", "b", "tag"))
    first = worker(store, plan, "first")
    first.start()
    async with asyncio.timeout(10):
        await steps.started.setdefault("b", asyncio.Event()).wait()
    await until(lambda: store.get(action_id).step("b").record == {"half": True}, 10)  # type: ignore[union-attr]
    await first.stop()  # killed: its lease is left to expire
    steps.block["b"].set()
    second = worker(store, plan, "second")
    second.start()
    try:
        done = await finished(store, action_id)
    finally:
        await second.stop()
    assert done.lifecycle is ActionLifecycle.COMPLETE
    assert steps.runs == {"a": 1, "b": 2, "tag": 1}  # a done once; b again from its record
    assert steps.records["b"] == {"half": True}
    assert done.step("b").try_number == 2  # type: ignore[union-attr]


async def test_a_stop_ends_the_running_step_and_runs_only_the_final_one(
    database: Database,
) -> None:
    store, steps = ActionStore(database), Steps()
    steps.block["a"] = asyncio.Event()
    plan = (steps.ok("a"), steps.ok("b"), steps.final("tag"))
    action_id = new_action(store, ("a", "b", "tag"))
    running = worker(store, plan, "one")
    running.start()
    try:
        await asyncio.wait_for(steps.started.setdefault("a", asyncio.Event()).wait(), 10)
        assert store.request_stop(action_id, "operator", {"command": "stop"})
        steps.block["a"].set()
        done = await finished(store, action_id)
    finally:
        await running.stop()
    assert done.lifecycle is ActionLifecycle.FAILED
    assert [s.state for s in done.steps] == [
        model.StepState.SUCCESS, model.StepState.NOT_RUN, model.StepState.SUCCESS,
    ]  # fmt: skip
    assert done.step("b").notes[-1].text == "not run: action stopped by operator"  # type: ignore[union-attr]
    assert not store.request_stop(action_id, "operator", {"command": "stop"})  # finished


async def test_two_replicas_run_each_action_exactly_once(database: Database) -> None:
    store, steps = ActionStore(database), Steps()
    plan = (steps.ok("a"), steps.ok("b"))
    ids = [new_action(store, ("a", "b")) for _ in range(6)]
    replicas = [worker(store, plan, "left"), worker(store, plan, "right")]
    for replica in replicas:
        replica.start()
    try:
        for action_id in ids:
            assert (await finished(store, action_id)).lifecycle is ActionLifecycle.COMPLETE
    finally:
        for replica in replicas:
            await replica.stop()
    assert steps.runs == {"a": 6, "b": 6}


def pausing(steps: Steps, name: str, hold: asyncio.Event | None = None) -> Planned:
    """A step that (after ``hold``, its uninterruptible phase) waits an hour."""

    async def run(ctx: StepContext) -> str:
        steps.runs[name] = steps.runs.get(name, 0) + 1
        steps.started.setdefault(name, asyncio.Event()).set()
        if hold is not None:
            await hold.wait()
        await ctx.note(f"{name}: waiting an hour")
        await ctx.pause(3600)
        return f"{name} waited an hour"

    return Planned(name, run)


async def test_a_stop_through_another_replica_interrupts_a_waiting_step(
    database: Database,
) -> None:
    """Issue 27, point 8: a stop waited for the running step to end (109 s in a lab).
    Asked through another replica (the database only), it ends the step's wait at the
    worker's next look; the step is ``shutdown``, the rest not run but the final one."""
    store, steps = ActionStore(database), Steps()
    plan = (pausing(steps, "a"), steps.ok("b"), steps.final("tag"))
    action_id = new_action(store, ("a", "b", "tag"))
    running = worker(store, plan, "one")
    running.start()
    try:
        await asyncio.wait_for(steps.started.setdefault("a", asyncio.Event()).wait(), 10)
        assert store.request_stop(action_id, "operator", {"command": "stop"})
        done = await finished(store, action_id, within=30)  # the step's wait: an hour
    finally:
        await running.stop()
    assert done.lifecycle is ActionLifecycle.FAILED
    assert [s.state for s in done.steps] == [
        model.StepState.STOPPED, model.StepState.NOT_RUN, model.StepState.SUCCESS,
    ]  # fmt: skip
    a = done.step("a")
    assert a is not None
    assert a.end is not None
    assert a.notes[-1].text == "stopped by operator: interrupted while it waited"
    assert steps.runs == {"a": 1, "tag": 1}


async def test_a_stop_waits_for_the_uninterruptible_phase_only(database: Database) -> None:
    """Asked on the replica running the action: heard at once, but the step's phase in
    progress (an apply, say) finishes first; the step ends at its next wait."""
    store, steps = ActionStore(database), Steps()
    hold = asyncio.Event()
    plan = (pausing(steps, "a", hold), steps.final("tag"))
    action_id = new_action(store, ("a", "tag"))
    running = worker(store, plan, "one")
    running.start()
    try:
        await asyncio.wait_for(steps.started.setdefault("a", asyncio.Event()).wait(), 10)
        assert store.request_stop(action_id, "operator", {"command": "stop"})
        running.stopping(action_id)
        await asyncio.sleep(0)  # (a chance to cut the phase short, which must not be taken)
        found = store.get(action_id)
        assert found is not None
        assert found.step("a").state is model.StepState.RUNNING  # type: ignore[union-attr]
        hold.set()  # the phase ends: the step reaches its wait
        done = await finished(store, action_id, within=30)
    finally:
        await running.stop()
    assert [s.state for s in done.steps] == [model.StepState.STOPPED, model.StepState.SUCCESS]
    assert "a: waiting an hour" in [n.text for n in done.step("a").notes]  # type: ignore[union-attr]


async def test_an_action_stopped_while_its_replica_was_down_stays_stopped(
    database: Database,
) -> None:
    """Kill at any point: the replica running a waiting step is killed, the stop is
    stored meanwhile; the replica that takes the action over ends the step as stopped
    without running it again, and a later replica finds the action finished."""
    store, steps = ActionStore(database), Steps()
    plan = (pausing(steps, "a"), steps.ok("b"), steps.final("tag"))
    action_id = new_action(store, ("a", "b", "tag"))
    first = worker(store, plan, "first")
    first.start()
    await asyncio.wait_for(steps.started.setdefault("a", asyncio.Event()).wait(), 10)
    await first.stop()  # killed: its lease is left to expire
    assert store.request_stop(action_id, "operator", {"command": "stop"})
    second = worker(store, plan, "second")
    second.start()
    try:
        done = await finished(store, action_id, within=30)
    finally:
        await second.stop()
    assert [s.state for s in done.steps] == [
        model.StepState.STOPPED, model.StepState.NOT_RUN, model.StepState.SUCCESS,
    ]  # fmt: skip
    assert done.step("a").notes[-1].text == "stopped by operator: interrupted by a restart"  # type: ignore[union-attr]
    assert steps.runs == {"a": 1, "tag": 1}, "the stopped step is not run again"
    third = worker(store, plan, "third")
    third.start()
    try:
        await third.jobs.scan()
        assert store.get(action_id) == done, "a finished action is not taken again"
    finally:
        await third.stop()


def test_the_store_keeps_who_created_an_action(database: Database) -> None:
    """Migration 0005_action_caller: the creator's identity (for impersonation and the
    re-check at start) stored and read back; an action without one reads as None."""
    store = ActionStore(database)
    who = {"username": "system:serviceaccount:ops:deployer", "uid": "u-1",
           "groups": ["system:serviceaccounts", "system:authenticated"],
           "extra": {"authentication.kubernetes.io/credential-id": ["JTI=abc"]}}  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    action = model.Action(
        id=new_action_id(now, os.urandom(10)), name="deploy_site", parameters={},
        lifecycle=ActionLifecycle.PENDING, created=now, updated=now, user=who["username"],
        context_marker=None, committed_rev_id=1, revision=None, allow_intermediate_commits=False,
        steps=(model.Step("validation", 0),), caller=who,
    )  # fmt: skip
    store.create(action)
    found = store.get(action.id)
    assert found is not None
    assert found.caller == who
    assert "caller" not in found.to_wire("/x")  # never shown
    # a deploy_site runs alone: finished, so that the next one may be stored
    assert store.leases.take(action.id, "t", now, now + dt.timedelta(seconds=LEASE))
    assert store.set_lifecycle(action.id, "t", ActionLifecycle.COMPLETE, now)
    assert store.get(new_action(store, ("a",))).caller is None  # type: ignore[union-attr]


def test_actions_stored_before_the_caller_column_read_without_one(database_url: str) -> None:
    """An action stored at migration 0003 reads back, after 0005_action_caller, with no
    caller: its steps then fail rather than run as serve (tests/integration/
    test_site_apply_as_caller.py)."""
    from metalmend.db import migrate
    from metalmend.siteactions.tables import actions

    db = Database.open(database_url)
    try:
        migrate.upgrade(db, "0003_actions")
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        with db.begin() as conn:
            conn.execute(
                actions.insert().values(
                    action_id="01JOLDACTION0000000000000",
                    name="deploy_site",
                    parameters={},
                    lifecycle="Pending",
                    created=now,
                    updated=now,
                    user="someone",
                    context_marker=None,
                    committed_rev_id=1,
                    revision=None,
                    allow_intermediate_commits=False,
                    notes=[],
                    command_audit=[],
                )  # the columns of 0003 only
            )
        migrate.upgrade(db)
        found = ActionStore(db).get("01JOLDACTION0000000000000")
        assert found is not None
        assert (found.user, found.caller) == ("someone", None)
    finally:
        db.dispose()
