"""``TaskStore``: tasks and their nodes in the database, and the lease that runs each once.

Several replicas of ``metalmend serve`` may share one PostgreSQL database; a task runs in
one of them at a time, under a lease on its row (``metalmend.db.lease``, shared with
Shipyard's actions): a replica that died stops renewing it and another takes the task
over, continuing from the nodes' stored records. Every write of a node's record is
conditional on still holding the lease.

One task per node at a time: ``create`` claims each node (a row of ``node_claims``, keyed
by the node) in the transaction that stores the task, and refuses with ``NodesBusy``,
storing nothing, when another task holds one. The claim goes when the node's record is
finished (``save_node``) or its task complete; a task whose replica died keeps its claims
while another replica takes it over (its lease), as it must: it is still destroying them.

Synchronous (SQLAlchemy Core); async code calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, and_, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from metalmend.db import Database
from metalmend.db.lease import Leases
from metalmend.db.lease import aware as _aware
from metalmend.db.lease import naive as _naive
from metalmend.destroy.model import Task
from metalmend.destroy.policy.destroy import NodeState, TaskStatus
from metalmend.destroy.tables import node_claims, task_nodes, tasks

LIST_LIMIT = 1000  # GET /tasks: the newest this many


class NodesBusy(Exception):
    """Nodes another task is destroying: node -> that task. Nothing was stored."""

    def __init__(self, busy: Mapping[str, str]) -> None:
        self.busy = dict(sorted(busy.items()))
        super().__init__(self.message)

    @property
    def lines(self) -> list[str]:
        return [f"Node {n} is being destroyed by task {t}" for n, t in self.busy.items()]

    @property
    def message(self) -> str:
        return "; ".join(self.lines)


class TaskStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def create(self, task: Task) -> None:
        """Store the task and claim its nodes, in one transaction; NodesBusy (nothing
        stored) when another task holds one of them."""
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
            self._claim(conn, task.task_id, list(task.nodes))

    def _claim(self, conn: Connection, task_id: str, nodes: Sequence[str]) -> None:
        """Each node's claim row, or none: a node held by another task is not inserted (ON
        CONFLICT DO NOTHING: on PostgreSQL a concurrent claim of the node waits for the
        other transaction and then finds its row; SQLite's writers are serialized), and
        NodesBusy rolls the whole transaction back."""
        dialect = postgresql if self.db.dialect == "postgresql" else sqlite
        taken: list[str] = []
        for node in nodes:
            insert = dialect.insert(node_claims).values(node=node, task_id=task_id)
            claimed = insert.on_conflict_do_nothing().returning(node_claims.c.node)
            if conn.execute(claimed).first() is None:
                taken.append(node)
        if taken:
            query = select(node_claims.c.node, node_claims.c.task_id).where(
                node_claims.c.node.in_(taken)
            )
            holders = {str(n): str(t) for n, t in conn.execute(query)}
            # a holder that let go meanwhile: still refused, this once (ask again)
            raise NodesBusy({n: holders.get(n, "(another, just finished)") for n in taken})

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
        """Of ``nodes``, those a task is destroying (claimed): node -> its task. A look
        before the other checks of a request; ``create`` decides, race-free."""
        query = select(node_claims.c.node, node_claims.c.task_id).where(
            node_claims.c.node.in_(nodes)
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
        if status is not TaskStatus.COMPLETE:
            return self.leases.update(self.leases.held(task_id, owner), values)
        values |= {"lease_owner": None, "lease_expires": None}
        with self.db.begin() as conn:
            if not self.leases.update_in(conn, self.leases.held(task_id, owner), values):
                return False
            conn.execute(delete(node_claims).where(node_claims.c.task_id == task_id))
            return True

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
            if state.finished:  # destroyed or failed: another task may take the node now
                conn.execute(
                    delete(node_claims).where(
                        and_(node_claims.c.node == node, node_claims.c.task_id == task_id)
                    )
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
