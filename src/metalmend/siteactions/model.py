"""A stored action and its steps, and their JSON as Shipyard answers them (Shipyard's API
reference, https://airship-shipyard.readthedocs.io, "Actions": ``GET /actions/{id}``).

Step states are Airflow's, as Shipyard shows them: ``pending`` (not reached yet),
``running``, ``success``, ``failed``, ``upstream_failed`` for a step never run
because one before it failed or the action was stopped, and ``shutdown`` (Airflow's state
of a task ended from outside) for the step a stop interrupted.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from metalmend.siteactions.policy.actions import ActionLifecycle

MAX_NOTES = 400  # per step: the newest are kept (a long drain notes every pod)


class StepState(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCESS = "success"
    FAILED = "failed"
    NOT_RUN = "upstream_failed"
    STOPPED = "shutdown"


FINISHED_STEP = frozenset(
    {StepState.SUCCESS, StepState.FAILED, StepState.NOT_RUN, StepState.STOPPED}
)
FINISHED = frozenset({ActionLifecycle.COMPLETE, ActionLifecycle.FAILED})

# Airflow's DAG run state, which Shipyard's ``dag_status`` shows.
DAG_STATUS = {
    ActionLifecycle.PENDING: "queued",
    ActionLifecycle.PROCESSING: "running",
    ActionLifecycle.COMPLETE: "success",
    ActionLifecycle.FAILED: "failed",
}


def iso(moment: dt.datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


@dataclass(frozen=True)
class Note:
    at: dt.datetime
    text: str

    def to_wire(self) -> dict[str, Any]:
        """As stored (a time and a text); ``shown`` is what the API answers."""
        return {"note_timestamp": iso(self.at), "note_val": self.text}

    def shown(self, sub_type: str, subject: str, assoc_id: str) -> dict[str, Any]:
        """The note as Shipyard answers one (its notes helper: ``assoc_id`` as
        ``action/ID`` or ``step/ID/STEP``, ``subject`` the action's id or the step's name,
        ``sub_type`` action or step, ``verbosity`` 1, a ``note_id`` that stays the same
        from one answer to the next, no URL to resolve)."""
        seed = f"{assoc_id}\0{iso(self.at)}\0{self.text}".encode()  # kept when older go
        note_id = base64.b32encode(hashlib.sha256(seed).digest()).decode()[:26]
        return {
            "assoc_id": assoc_id,
            "subject": subject,
            "sub_type": sub_type,
            "note_val": self.text,
            "verbosity": 1,
            "note_id": note_id,
            "note_timestamp": iso(self.at),
            "resolved_url_value": None,
        }

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Note:
        at = dt.datetime.fromisoformat(str(raw.get("note_timestamp")).replace("Z", "+00:00"))
        return cls(at, str(raw.get("note_val", "")))


@dataclass(frozen=True)
class Step:
    name: str
    index: int
    state: StepState = StepState.PENDING
    record: Mapping[str, Any] = field(default_factory=dict)
    notes: tuple[Note, ...] = ()
    try_number: int = 0
    start: dt.datetime | None = None
    end: dt.datetime | None = None

    def shown_notes(self, action_id: str) -> list[dict[str, Any]]:
        assoc = f"step/{action_id}/{self.name}"
        return [n.shown("step", self.name, assoc) for n in self.notes]

    def summary(self, action_url: str, action_id: str) -> dict[str, Any]:
        """As listed in an action: id, url, index, state, notes."""
        return {
            "id": self.name,
            "url": f"{action_url}/steps/{self.name}",
            "index": self.index,
            "state": str(self.state),
            "notes": self.shown_notes(action_id),
        }

    def detail(self, action_id: str) -> dict[str, Any]:
        """``GET /actions/{id}/steps/{step}``: Airflow's task instance, as Shipyard shows it."""
        duration = (self.end - self.start).total_seconds() if self.start and self.end else None
        return {
            "task_id": self.name,
            "index": self.index,
            "state": str(self.state),
            "start_date": iso(self.start),
            "end_date": iso(self.end),
            "duration": duration,
            "try_number": self.try_number,
            "operator": "metalmend",
            "notes": self.shown_notes(action_id),
        }


@dataclass(frozen=True)
class Action:
    id: str
    name: str
    parameters: Mapping[str, Any]
    lifecycle: ActionLifecycle
    created: dt.datetime
    updated: dt.datetime
    user: str
    context_marker: str | None
    committed_rev_id: int | None
    revision: int | None
    allow_intermediate_commits: bool
    steps: tuple[Step, ...] = ()
    notes: tuple[Note, ...] = ()
    command_audit: tuple[Mapping[str, Any], ...] = ()
    stop_requested: str | None = None
    # Who created it, as the TokenReview answered (``kube.impersonate.Who.to_wire``); kept
    # for impersonation and the re-check at start, never shown (groups and extras are the
    # caller's own business).
    caller: Mapping[str, Any] | None = None

    @property
    def finished(self) -> bool:
        return self.lifecycle in FINISHED

    def step(self, name: str) -> Step | None:
        return next((s for s in self.steps if s.name == name), None)

    def to_wire(self, url: str) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "parameters": dict(self.parameters),
            "dag_id": self.name,  # Airflow's DAG is named after the action, as upstream
            "dag_status": DAG_STATUS[self.lifecycle],
            "dag_execution_date": iso(self.created),
            "action_lifecycle": str(self.lifecycle),
            "datetime": iso(self.created),
            "updated": iso(self.updated),
            "user": self.user,
            "context_marker": self.context_marker,
            "committed_rev_id": self.committed_rev_id,
            "design_revision": self.revision,
            "allow_intermediate_commits": self.allow_intermediate_commits,
            "steps": [s.summary(url, self.id) for s in self.steps],
            "validations": [],
            "command_audit": [dict(c) for c in self.command_audit],
            "notes": [n.shown("action", self.id, f"action/{self.id}") for n in self.notes],
            "stop_requested_by": self.stop_requested,
        }

    def note_ids(self) -> set[str]:
        """The ``note_id`` of every note of the action and of its steps, as answered."""
        shown = [n.shown("action", self.id, f"action/{self.id}") for n in self.notes]
        shown += [n for s in self.steps for n in s.shown_notes(self.id)]
        return {str(n["note_id"]) for n in shown}

    def listed(self) -> dict[str, Any]:
        """``GET /actions``: the action without its notes, with step counts by state."""
        counts = {"success": 0, "failed": 0, "other": 0}
        for step in self.steps:
            key = (
                str(step.state) if step.state in (StepState.SUCCESS, StepState.FAILED) else "other"
            )
            counts[key] += 1
        wire = self.to_wire(f"/actions/{self.id}")
        wire.pop("notes")
        return wire | {"step_counts": counts}
