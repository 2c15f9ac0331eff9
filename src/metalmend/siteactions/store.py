"""``ActionStore``: Shipyard's actions and their steps in the database, run once each under
a lease (``metalmend.db.lease``, as Drydock's tasks).

Every write made while running an action (a step started, its record saved, a note, a
step finished, the action finished) is conditional on the runner still holding the
action's lease: a replica that lost it changes nothing more. Creating an action and asking
it to stop are the callers' writes, not the runner's.

Which actions may run side by side (``policy.actions.collision``: a site action alone;
redeploy_server and relabel_nodes beside others that act on other nodes) is decided by
``create`` in the transaction that stores the action, as Drydock's ``TaskStore.create``
claims its nodes in its own: the check reads the actions not finished after taking the
store's admission lock (``Database.lock``: a PostgreSQL advisory lock held to the end of
the transaction, so every replica's creates are serialized; SQLite's ``BEGIN IMMEDIATE``),
and refuses with ``ActionsCollide``, storing nothing. An action holds its nodes until it
is Complete or Failed: nothing is left to release.

Synchronous (SQLAlchemy Core); async code calls it through ``asyncio.to_thread``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, select, update

from metalmend.db import Database
from metalmend.db.lease import Leases, aware, naive
from metalmend.errors import Conflict
from metalmend.siteactions.model import MAX_NOTES, Action, Note, Step, StepState
from metalmend.siteactions.policy.actions import (
    ActionLifecycle,
    ActionName,
    Running,
    action_targets,
    collision,
)
from metalmend.siteactions.tables import action_steps, actions

LIST_LIMIT = 1000  # GET /actions: the newest this many
# The name of the lock that serializes the creates of actions across replicas.
ADMISSION_LOCK = "shipyard-actions-admission"


class ActionsCollide(Conflict):
    """The new action may not run beside an action not finished (its message names that
    action, its name and the nodes they share, or that a site action runs alone). Nothing
    was stored."""


class ActionStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        unfinished = actions.c.lifecycle.in_(
            [str(ActionLifecycle.PENDING), str(ActionLifecycle.PROCESSING)]
        )
        self.leases = Leases(db, actions, actions.c.action_id, unfinished, actions.c.created)

    # ---- the callers' writes ----------------------------------------------------------------

    def create(self, action: Action) -> None:
        """Store the action and its steps, once no action not finished is in its way,
        in one transaction; ActionsCollide (nothing stored) when one is."""
        with self.db.begin() as conn:
            self.db.lock(conn, ADMISSION_LOCK)
            why = collision(
                ActionName(action.name),
                action_targets(action.name, action.parameters),
                _running(conn, self.leases),
            )
            if why is not None:
                raise ActionsCollide(why, [why])
            conn.execute(
                actions.insert().values(
                    action_id=action.id,
                    name=action.name,
                    parameters=dict(action.parameters),
                    lifecycle=str(action.lifecycle),
                    created=naive(action.created),
                    updated=naive(action.updated),
                    user=action.user,
                    context_marker=action.context_marker,
                    committed_rev_id=action.committed_rev_id,
                    revision=action.revision,
                    allow_intermediate_commits=action.allow_intermediate_commits,
                    notes=[n.to_wire() for n in action.notes],
                    command_audit=[dict(c) for c in action.command_audit],
                    caller=dict(action.caller) if action.caller is not None else None,
                )
            )
            for step in action.steps:
                conn.execute(
                    action_steps.insert().values(
                        action_id=action.id,
                        step=step.name,
                        position=step.index,
                        state=str(step.state),
                        record={},
                        notes=[],
                        try_number=0,
                    )
                )

    def request_stop(self, action_id: str, user: str, audit: Mapping[str, Any]) -> bool:
        """Ask a running action to stop (its runner sees it at its step's next pause, or
        before its next step); False when it has already finished."""
        with self.db.begin() as conn:
            row = conn.execute(
                select(actions.c.lifecycle, actions.c.command_audit).where(
                    actions.c.action_id == action_id
                )
            ).first()
            if row is None or row.lifecycle not in (
                ActionLifecycle.PENDING,
                ActionLifecycle.PROCESSING,
            ):
                return False
            conn.execute(
                update(actions)
                .where(actions.c.action_id == action_id)
                .values(stop_requested=user, command_audit=[*row.command_audit, dict(audit)])
            )
            return True

    # ---- reading ------------------------------------------------------------------------------

    def stop_requested(self, action_id: str) -> str | None:
        """Who asked the action to stop (None: nobody, or no such action)."""
        with self.db.read() as conn:
            row = conn.execute(
                select(actions.c.stop_requested).where(actions.c.action_id == action_id)
            ).first()
        return None if row is None else row.stop_requested

    def get(self, action_id: str) -> Action | None:
        with self.db.read() as conn:
            row = conn.execute(select(actions).where(actions.c.action_id == action_id)).first()
            if row is None:
                return None
            return _action(row._mapping, _steps(conn, [action_id]).get(action_id, ()))

    def newest(self, limit: int = LIST_LIMIT) -> list[Action]:
        with self.db.read() as conn:
            query = select(actions).order_by(actions.c.action_id.desc()).limit(limit)
            rows = [r._mapping for r in conn.execute(query)]
            steps = _steps(conn, [str(r["action_id"]) for r in rows])
        return [_action(r, steps.get(str(r["action_id"]), ())) for r in rows]

    # ---- the runner's writes, under the lease -------------------------------------------------

    def set_lifecycle(
        self, action_id: str, owner: str, lifecycle: ActionLifecycle, now: dt.datetime
    ) -> bool:
        values: dict[str, Any] = {"lifecycle": str(lifecycle), "updated": naive(now)}
        if lifecycle in (ActionLifecycle.COMPLETE, ActionLifecycle.FAILED):
            values |= {"lease_owner": None, "lease_expires": None}
        return self.leases.update(self.leases.held(action_id, owner), values)

    def set_revision(self, action_id: str, owner: str, revision: int) -> bool:
        return self.leases.update(self.leases.held(action_id, owner), {"revision": revision})

    def action_note(self, action_id: str, owner: str, note: Note) -> bool:
        with self.db.begin() as conn:
            found = conn.execute(
                select(actions.c.notes).where(self.leases.held(action_id, owner))
            ).first()
            if found is None:
                return False
            notes = [*found.notes, note.to_wire()][-MAX_NOTES:]
            return self.leases.update_in(conn, self.leases.held(action_id, owner), {"notes": notes})

    def update_step(
        self,
        action_id: str,
        owner: str,
        step: str,
        now: dt.datetime,
        *,
        values: Mapping[str, Any] | None = None,
        note: Note | None = None,
    ) -> bool:
        """Change one step's row (and append ``note``), only while ``owner`` holds the lease."""
        with self.db.begin() as conn:
            held = self.leases.held(action_id, owner)
            if not self.leases.update_in(conn, held, {"updated": naive(now)}):
                return False
            changes = dict(values or {})
            for key in ("start_date", "end_date"):
                if isinstance(changes.get(key), dt.datetime):
                    changes[key] = naive(changes[key])
            if note is not None:
                changes["notes"] = [*_step_notes(conn, action_id, step), note.to_wire()][
                    -MAX_NOTES:
                ]
            if changes:
                conn.execute(
                    update(action_steps)
                    .where(action_steps.c.action_id == action_id, action_steps.c.step == step)
                    .values(**changes)
                )
            return True


def _running(conn: Connection, leases: Leases) -> list[Running]:
    """The actions pending or running, each with the nodes it acts on (none: a site
    action), oldest first: what a new action must not collide with."""
    query = (
        select(actions.c.action_id, actions.c.name, actions.c.parameters)
        .where(leases.unfinished)
        .order_by(actions.c.action_id)
    )
    return [
        Running(str(r.action_id), str(r.name), frozenset(action_targets(r.name, r.parameters)))
        for r in conn.execute(query)
    ]


def _step_notes(conn: Connection, action_id: str, step: str) -> list[Any]:
    row = conn.execute(
        select(action_steps.c.notes).where(
            action_steps.c.action_id == action_id, action_steps.c.step == step
        )
    ).first()
    return list(row.notes) if row is not None else []


def _steps(conn: Connection, ids: Sequence[str]) -> dict[str, tuple[Step, ...]]:
    found: dict[str, list[Step]] = {}
    if not ids:
        return {}
    query = (
        select(action_steps)
        .where(action_steps.c.action_id.in_(ids))
        .order_by(action_steps.c.action_id, action_steps.c.position)
    )
    for row in conn.execute(query):
        r = row._mapping
        try:
            state = StepState(r["state"])
        except ValueError:
            state = StepState.PENDING
        found.setdefault(str(r["action_id"]), []).append(
            Step(
                name=str(r["step"]),
                index=int(r["position"]),
                state=state,
                record=dict(r["record"] or {}),
                notes=tuple(Note.from_wire(n) for n in r["notes"] or ()),
                try_number=int(r["try_number"]),
                start=aware(r["start_date"]) if r["start_date"] else None,
                end=aware(r["end_date"]) if r["end_date"] else None,
            )
        )
    return {k: tuple(v) for k, v in found.items()}


def _action(row: Mapping[Any, Any], steps: tuple[Step, ...]) -> Action:
    try:
        lifecycle = ActionLifecycle(row["lifecycle"])
    except ValueError:
        lifecycle = ActionLifecycle.PENDING
    return Action(
        id=str(row["action_id"]),
        name=str(row["name"]),
        parameters=dict(row["parameters"]),
        lifecycle=lifecycle,
        created=aware(row["created"]),
        updated=aware(row["updated"]),
        user=str(row["user"]),
        context_marker=row["context_marker"],
        committed_rev_id=row["committed_rev_id"],
        revision=row["revision"],
        allow_intermediate_commits=bool(row["allow_intermediate_commits"]),
        steps=steps,
        notes=tuple(Note.from_wire(n) for n in row["notes"] or ()),
        command_audit=tuple(row["command_audit"] or ()),
        stop_requested=row["stop_requested"],
        caller=row["caller"] if isinstance(row["caller"], Mapping) else None,
    )
