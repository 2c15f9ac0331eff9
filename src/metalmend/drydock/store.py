"""``TaskStore``: tasks and their nodes in the database, and the lease that runs each once.

Several replicas of ``metalmend serve`` may share one PostgreSQL database; a task runs in
one of them at a time, under a lease on its row (``metalmend.db.lease``, shared with
Shipyard's actions): a replica that died stops renewing it and another takes the task
over, continuing from the nodes' stored records. Every write of a node's record is
conditional on still holding the lease.

Synchronous (SQLAlchemy Core); async code calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, and_, select, update

from metalmend.db import Database
from metalmend.db.lease import Leases
from metalmend.db.lease import aware as _aware
from metalmend.db.lease import naive as _naive
from metalmend.drydock.model import Task
from metalmend.drydock.tables import task_nodes, tasks
from metalmend.policy.destroy import NodeState, TaskStatus

LIST_LIMIT = 1000  # GET /tasks: the newest this many


class TaskStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, task: Task) -> None:
        with self.db.begin() as conn:
            conn.execute(
                tasks.insert().values(
                    task_id=task.task_id,
                    action=task.action,
                    design_ref=task.design_ref,
                    node_filter=task.node_filter,
                    preserve_local_storage=task.preserve_local_storage,
                    status=str(task.status),
                    created=_naive(task.created),
                    created_by=task.created_by,
                    updated=_naive(task.updated),
                    context_marker=task.context_marker,
                )
            )
            for position, (node, state) in enumerate(task.nodes.items()):
                conn.execute(
                    task_nodes.insert().values(
                        task_id=task.task_id,
                        node=node,
                        position=position,
                        state=state.to_wire(),
                        updated=_naive(task.created),
                    )
                )

    def get(self, task_id: str) -> Task | None:
        with self.db.read() as conn:
            row = conn.execute(select(tasks).where(tasks.c.task_id == task_id)).first()
            if row is None:
                return None
            return _task(row._mapping, _nodes(conn, [task_id]).get(task_id, {}))

    def newest(self) -> list[Task]:
        with self.db.read() as conn:
            query = select(tasks).order_by(tasks.c.created.desc()).limit(LIST_LIMIT)
            rows = [r._mapping for r in conn.execute(query)]
            nodes = _nodes(conn, [str(r["task_id"]) for r in rows])
        return [_task(r, nodes.get(str(r["task_id"]), {})) for r in rows]

    def busy(self, nodes: Sequence[str]) -> dict[str, str]:
        """Of ``nodes``, those a task not complete is destroying: node -> its task."""
        query = (
            select(task_nodes.c.node, tasks.c.task_id)
            .join(tasks, tasks.c.task_id == task_nodes.c.task_id)
            .where(and_(tasks.c.status != str(TaskStatus.COMPLETE), task_nodes.c.node.in_(nodes)))
        )
        with self.db.read() as conn:
            return {str(node): str(task_id) for node, task_id in conn.execute(query)}

    # ---- running tasks: the lease (metalmend.db.lease) --------------------------------------

    @property
    def leases(self) -> Leases:
        unfinished = tasks.c.status != str(TaskStatus.COMPLETE)
        return Leases(self.db, tasks, tasks.c.task_id, unfinished, tasks.c.created)

    def runnable(self, now: dt.datetime) -> list[str]:
        """Tasks not complete whose lease is free or expired, oldest first."""
        return self.leases.runnable(now)

    def take(self, task_id: str, owner: str, now: dt.datetime, until: dt.datetime) -> bool:
        """Take the lease of a task not complete, if it is free, expired or ours."""
        return self.leases.take(task_id, owner, now, until)

    def renew(self, task_id: str, owner: str, until: dt.datetime) -> bool:
        """Extend our lease; False when it is no longer ours."""
        return self.leases.renew(task_id, owner, until)

    def set_status(self, task_id: str, owner: str, status: TaskStatus, now: dt.datetime) -> bool:
        values: dict[str, Any] = {"status": str(status), "updated": _naive(now)}
        if status is TaskStatus.COMPLETE:
            values |= {"lease_owner": None, "lease_expires": None}
        return self.leases.update(self.leases.held(task_id, owner), values)

    def save_node(
        self, task_id: str, owner: str, node: str, state: NodeState, now: dt.datetime
    ) -> bool:
        """Store a node's record, only while ``owner`` holds the task's lease."""
        with self.db.begin() as conn:
            leases = self.leases
            if not leases.update_in(conn, leases.held(task_id, owner), {"updated": _naive(now)}):
                return False
            conn.execute(
                update(task_nodes)
                .where(and_(task_nodes.c.task_id == task_id, task_nodes.c.node == node))
                .values(state=state.to_wire(), updated=_naive(now))
            )
            return True


def _nodes(conn: Connection, ids: Sequence[str]) -> dict[str, dict[str, NodeState]]:
    found: dict[str, dict[str, NodeState]] = {}
    if not ids:
        return found
    query = (
        select(task_nodes.c.task_id, task_nodes.c.node, task_nodes.c.state)
        .where(task_nodes.c.task_id.in_(ids))
        .order_by(task_nodes.c.task_id, task_nodes.c.position)
    )
    for task_id, node, state in conn.execute(query):
        found.setdefault(str(task_id), {})[str(node)] = NodeState.from_wire(state)
    return found


def _task(row: Mapping[Any, Any], nodes: dict[str, NodeState]) -> Task:
    try:
        status = TaskStatus(row["status"])
    except ValueError:
        status = TaskStatus.REQUESTED
    return Task(
        task_id=str(row["task_id"]),
        action=str(row["action"]),
        design_ref=str(row["design_ref"]),
        node_filter=row["node_filter"],
        preserve_local_storage=bool(row["preserve_local_storage"]),
        status=status,
        created=_aware(row["created"]),
        created_by=str(row["created_by"]),
        updated=_aware(row["updated"]),
        context_marker=row["context_marker"],
        nodes=nodes,
    )
