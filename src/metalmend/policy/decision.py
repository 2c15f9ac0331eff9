"""The one shape of a decision, shared by every controller (docs/decide-act.md).

A policy's ``decide(view, now, settings)`` is pure: it reads a frozen view of what was
observed and returns a ``Decision``: frozen action values, to be carried out in order by
the controller's executor, and the next deadline at which the key must be looked at again
(``requeue_at``; None when only a watch event can change the answer). Every policy's
action union includes ``Event``, the courtesy to the operator that no rule depends on.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Generic, TypeVar


class EventType(StrEnum):
    """A Kubernetes Event's ``type``."""

    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class Event:
    """Record a Kubernetes Event on the object the controller reconciles."""

    type: EventType
    reason: str
    message: str


@dataclass(frozen=True)
class TargetEvent:
    """Record a Kubernetes Event on one of a health check's targets instead of on the check:
    a Machine (``namespace/name``, policy.healthcheck's MachineEvent) or a Node (its name,
    policy.nodehealthcheck's NodeEvent)."""

    target: str
    type: EventType
    reason: str
    message: str


S = TypeVar("S")


@dataclass(frozen=True)
class SetStatus(Generic[S]):
    """Write the reconciled object's whole new status (``S``: its policy's status value;
    emitted only when it differs from what was read)."""

    status: S


A = TypeVar("A")


@dataclass
class Decision(Generic[A]):
    """What to do, in order, and when to look again. Built up by ``decide`` (``do``,
    ``note``, ``at`` return the decision, so rules read as one sentence); the values in it
    are frozen, and the executor never changes them."""

    actions: list[A | Event] = field(default_factory=list)
    requeue_at: dt.datetime | None = None

    def do(self, *actions: A | Event) -> Decision[A]:
        self.actions.extend(actions)
        return self

    def note(self, reason: str, message: str, warning: bool = False) -> Decision[A]:
        kind = EventType.WARNING if warning else EventType.NORMAL
        return self.do(Event(kind, reason, message))

    def at(self, deadline: dt.datetime | None) -> Decision[A]:
        """Look again at ``deadline`` at the latest (the earliest deadline wins)."""
        if deadline is not None and (self.requeue_at is None or deadline < self.requeue_at):
            self.requeue_at = deadline
        return self

    def then(self, other: Decision[A]) -> Decision[A]:
        """``other``'s actions after ours; the earlier of the two deadlines."""
        return self.do(*other.actions).at(other.requeue_at)

    def of(self, kind: type[A]) -> list[A]:
        """The actions of one type (for tests and executors that need them up front)."""
        return [a for a in self.actions if isinstance(a, kind)]

    @property
    def events(self) -> list[Event]:
        return [a for a in self.actions if isinstance(a, Event)]
