"""The task worker of ``metalmend serve``: runs the stored Drydock tasks (docs/destroy.md).

The leases, the scan and the renewals are ``db.leased`` (shared with Shipyard's
actions): of two replicas sharing a database only one runs a task, and a replica killed
mid-task leaves its lease (``destroy.lease_seconds``) to expire; the next one to look takes
the task and every node continues from its stored record. Nodes of one task run side by
side.

Task status: ``requested`` (stored, not taken yet), ``queued`` (taken, waiting for one of
this replica's ``MAX_RUNNING`` slots), ``running``, ``complete`` (every node finished).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import DatabaseUnavailable
from metalmend.db.lease import LeaseLost
from metalmend.db.leased import LeasedWorker, in_thread
from metalmend.destroy import metrics
from metalmend.destroy.destroy import DestroyNode
from metalmend.destroy.model import Task
from metalmend.destroy.policy.destroy import DestroySettings, NodeState, TaskStatus
from metalmend.destroy.store import TaskStore
from metalmend.log import fields

log = logging.getLogger(__name__)

SCAN_SECONDS = 2.0  # how often stored tasks are looked for (a POST wakes the worker at once)
MAX_RUNNING = 8  # tasks one replica runs at once; more wait as "queued"
FAILURES_BEFORE_GIVING_UP = 20  # unexpected failures in a row before a node is failed
RETRY_SECONDS = 5.0

# Makes the destroy of one node: (task, node, its record, how to save it) -> DestroyNode;
# metalmend serve's is ``destroy.destroy.DestroyNodes`` (built by ``metalmend.serve.root``).
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
        self._slots = asyncio.Semaphore(MAX_RUNNING)
        self.jobs = LeasedWorker(
            "drydock", store.leases, self._run, settings.lease_seconds,
            scan_seconds=SCAN_SECONDS, clock=clock, owner=owner,
        )  # fmt: skip
        self.owner = self.jobs.owner

    def start(self) -> None:
        self.jobs.start()

    def wake(self) -> None:
        self.jobs.wake()

    async def stop(self) -> None:
        """Stop looking and stop every task run here; their leases expire and a replica
        (or this one, started again) continues them."""
        await self.jobs.stop()

    async def scan(self) -> None:
        await self.jobs.scan()

    # ---- one task ---------------------------------------------------------------------------

    async def _run(self, task_id: str) -> None:
        await self._status(task_id, TaskStatus.QUEUED)
        async with self._slots:
            await self._status(task_id, TaskStatus.RUNNING)
            metrics.task_started()
            task = await in_thread(self.store.get, task_id)
            if task is None:
                return
            await self._nodes(task)
            await self._status(task_id, TaskStatus.COMPLETE)
            metrics.task_completed(task.created, self.clock.now())
            log.info("drydock: task complete", extra=fields(task=task_id))

    async def _nodes(self, task: Task) -> None:
        """Every node of the task side by side; a lost lease stops them all (a node's own
        failures are its own: ``_node`` keeps them)."""
        try:
            async with asyncio.TaskGroup() as group:
                for node, state in task.nodes.items():
                    group.create_task(self._node(task, node, state))
        except* LeaseLost:
            raise LeaseLost(task.task_id) from None
        except* DatabaseUnavailable:  # said once by metalmend.db; taken again once back
            raise DatabaseUnavailable() from None

    async def _status(self, task_id: str, status: TaskStatus) -> None:
        now = self.clock.now()
        if not await in_thread(self.store.set_status, task_id, self.owner, status, now):
            raise LeaseLost(task_id)

    async def _node(self, task: Task, node: str, state: NodeState) -> None:
        """Destroy one node to its end. An unexpected failure (the API server away, a bug)
        is tried again from the stored record; after many in a row the node fails,
        saying so, rather than keep the task open for ever. The database away stops the
        task (every node of it: nothing can be recorded); its worker takes it again, from
        the records, once the database answers."""

        async def save(new: NodeState) -> bool:
            now = self.clock.now()
            return await in_thread(self.store.save_node, task.task_id, self.owner, node, new, now)

        failures = 0
        while not state.finished:
            runner = self.runner(task, node, state, save)
            try:
                state = await runner.run()
            except (LeaseLost, asyncio.CancelledError, DatabaseUnavailable):
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
