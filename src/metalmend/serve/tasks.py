"""The task worker of ``metalmend serve``: runs the stored Drydock tasks (docs/destroy.md).

Started from the application's lifespan, it looks for tasks to run every ``SCAN_SECONDS``
(and at once when a task is posted): tasks not complete whose lease is free or expired
(``drydock.store``). It takes one with a conditional UPDATE, so of two replicas sharing a
database only one runs it, and renews the lease every third of ``destroy.lease_seconds``
while it runs; a replica that loses its lease stops that task at once (every write of a
node's record is conditional on the lease too). A replica killed mid-task leaves its lease
to expire; the next one to look (itself, restarted, or another) takes the task and every
node continues from its stored record. Nodes of one task run side by side.

Task status: ``requested`` (stored, not taken yet), ``queued`` (taken, waiting for one of
this replica's ``MAX_RUNNING`` slots), ``running``, ``complete`` (every node finished).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import os
import socket
import uuid
from collections.abc import Awaitable, Callable

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.drydock.destroy import DestroyNode, LeaseLost
from metalmend.drydock.model import Task
from metalmend.drydock.store import TaskStore
from metalmend.log import fields
from metalmend.policy.destroy import DestroySettings, NodeState, TaskStatus

log = logging.getLogger(__name__)

SCAN_SECONDS = 2.0  # how often stored tasks are looked for (a POST wakes the worker at once)
MAX_RUNNING = 8  # tasks one replica runs at once; more wait as "queued"
FAILURES_BEFORE_GIVING_UP = 20  # unexpected failures in a row before a node is failed
RETRY_SECONDS = 5.0

# Makes the destroy of one node: (task, node, its record, how to save it) -> DestroyNode.
NodeRunner = Callable[[Task, str, NodeState, Callable[[NodeState], Awaitable[bool]]], DestroyNode]


class TaskWorker:
    def __init__(
        self,
        store: TaskStore,
        runner: NodeRunner,
        settings: DestroySettings,
        clock: Clock = SYSTEM_CLOCK,
        owner: str | None = None,
    ) -> None:
        self.store, self.runner, self.settings, self.clock = store, runner, settings, clock
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._wake = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_RUNNING)
        self._running: dict[str, asyncio.Task[None]] = {}
        self._loop: asyncio.Task[None] | None = None

    # ---- life --------------------------------------------------------------------------------

    def start(self) -> None:
        if self._loop is None:
            self._loop = asyncio.create_task(self._scan_forever(), name="drydock-tasks")

    def wake(self) -> None:
        self._wake.set()

    async def stop(self) -> None:
        """Stop looking and stop every task run here; their leases expire and a replica
        (or this one, started again) continues them."""
        work = [t for t in (self._loop, *self._running.values()) if t is not None]
        for task in work:
            task.cancel()
        for task in work:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._loop = None

    async def _scan_forever(self) -> None:
        while True:
            try:
                await self.scan()
            except Exception:  # the database away for a moment: look again later
                log.exception("drydock: cannot look for tasks")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SCAN_SECONDS):
                    await self._wake.wait()
            self._wake.clear()

    async def scan(self) -> None:
        now = self.clock.now()
        for task_id in await asyncio.to_thread(self.store.runnable, now):
            if task_id in self._running:
                continue
            until = now + dt.timedelta(seconds=self.settings.lease_seconds)
            if await asyncio.to_thread(self.store.take, task_id, self.owner, now, until):
                log.info("drydock: task taken", extra=fields(task=task_id, owner=self.owner))
                self._running[task_id] = asyncio.create_task(self._run(task_id))

    # ---- one task ---------------------------------------------------------------------------

    async def _run(self, task_id: str) -> None:
        renewing = asyncio.create_task(self._renew(task_id, asyncio.current_task()))
        try:
            await self._status(task_id, TaskStatus.QUEUED)
            async with self._slots:
                await self._status(task_id, TaskStatus.RUNNING)
                task = await asyncio.to_thread(self.store.get, task_id)
                if task is None:
                    return
                await self._nodes(task)
                await self._status(task_id, TaskStatus.COMPLETE)
                log.info("drydock: task complete", extra=fields(task=task_id))
        except (LeaseLost, asyncio.CancelledError):
            log.info("drydock: task left to another replica", extra=fields(task=task_id))
        except Exception:
            log.exception(
                "drydock: task %s stopped; its lease expires and it is taken again", task_id
            )
        finally:
            renewing.cancel()
            self._running.pop(task_id, None)

    async def _nodes(self, task: Task) -> None:
        """Every node of the task side by side; a lost lease stops them all (a node's own
        failures are its own: ``_node`` keeps them)."""
        try:
            async with asyncio.TaskGroup() as group:
                for node, state in task.nodes.items():
                    group.create_task(self._node(task, node, state))
        except* LeaseLost:
            raise LeaseLost(task.task_id) from None

    async def _status(self, task_id: str, status: TaskStatus) -> None:
        now = self.clock.now()
        if not await asyncio.to_thread(self.store.set_status, task_id, self.owner, status, now):
            raise LeaseLost(task_id)

    async def _renew(self, task_id: str, run: asyncio.Task[object] | None) -> None:
        lease = self.settings.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            until = self.clock.now() + dt.timedelta(seconds=lease)
            try:
                held = await asyncio.to_thread(self.store.renew, task_id, self.owner, until)
            except Exception:  # the database away: keep going until the lease runs out
                log.exception("drydock: cannot renew the lease of task %s", task_id)
                continue
            if not held and run is not None:
                log.warning("drydock: lease of task %s lost; stopping it here", task_id)
                run.cancel()
                return

    async def _node(self, task: Task, node: str, state: NodeState) -> None:
        """Destroy one node to its end. An unexpected failure (the API server away, a bug)
        is tried again from the stored record; after many in a row the node fails,
        saying so, rather than keep the task open for ever."""

        async def save(new: NodeState) -> bool:
            now = self.clock.now()
            return await asyncio.to_thread(
                self.store.save_node, task.task_id, self.owner, node, new, now
            )

        failures = 0
        while not state.finished:
            runner = self.runner(task, node, state, save)
            try:
                state = await runner.run()
            except (LeaseLost, asyncio.CancelledError):
                raise
            except Exception as error:
                failures += 1
                state = runner.state
                where = fields(task=task.task_id, node=node, failures=failures)
                log.exception("drydock: destroy of %s failed; trying again", node, extra=where)
                if failures >= FAILURES_BEFORE_GIVING_UP:
                    text = f"{state.step}: metalmend serve failed: {type(error).__name__}"
                    state = state.fail(self.clock.now(), text)
                    if not await save(state):
                        raise LeaseLost(task.task_id) from None
                    return
                await asyncio.sleep(RETRY_SECONDS)
