"""The domain's error vocabulary: what went wrong, in the operator's words, without HTTP.

Domain code (the teardown steps, the stores, the site actions, Drydock's destroy) raises
these; only the HTTP layer turns them into Status bodies (``metalmend.web.status.status_of``),
each kind to one HTTP status, in one exception handler. A caller in the same process (a site
action running a teardown step, Drydock's destroy claiming a host) catches the kind it can
act on (``except NotFound``) instead of comparing HTTP codes.

Every error carries the operator's ``message`` (one sentence: what and why), optional
``lines`` (the problems one by one, and what was done before it stopped, each a
``Message``) and a ``reason``: the short name Airship's Status bodies give it
(``NotFound``, ``ClearLabelsError``), by default the kind's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

SIMPLE = "SimpleMessage"


@dataclass(frozen=True)
class Message:
    """One line for the operator: an error (``error``) or a note of what was done."""

    message: str
    error: bool
    kind: str = SIMPLE

    def to_wire(self) -> dict[str, Any]:
        return {"message": self.message, "error": self.error, "kind": self.kind}


VALIDATION = "ValidationMessage"


@dataclass(frozen=True)
class ValidationMessage(Message):
    """A problem a validation found, as Airship's API conventions write one: beside the
    message, the validation's ``name``, its ``level`` (``Error``, or ``Info`` for a note)
    and the ``documents`` it concerns. Shipyard's client prints ``- level: name`` and the
    message under it, and counts the levels (a missing one prints ``- None: None``)."""

    kind: str = VALIDATION
    name: str = "metalmend-site-design"

    def to_wire(self) -> dict[str, Any]:
        level = "Error" if self.error else "Info"
        return {**super().to_wire(), "name": self.name, "level": level, "documents": []}


def errors(*lines: str) -> list[Message]:
    return [Message(line, True) for line in lines]


def notes(*lines: str) -> list[Message]:
    return [Message(line, False) for line in lines]


class MetalmendError(Exception):
    """The root of the vocabulary; raise one of its kinds."""

    default_reason: ClassVar[str] = "InternalError"

    def __init__(
        self,
        message: str,
        lines: Sequence[Message | str] = (),
        *,
        reason: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.lines = [m if isinstance(m, Message) else Message(m, True) for m in lines]
        self.reason = reason or self.default_reason

    @property
    def problems(self) -> list[str]:
        """The error lines alone."""
        return [m.message for m in self.lines if m.error]


class NotFound(MetalmendError):
    """What was named does not exist (a Node, a revision, a task)."""

    default_reason = "NotFound"


class Conflict(MetalmendError):
    """Not now: the state of what was named forbids it (a claim held, pods still bound)."""

    default_reason = "Conflict"


class Refused(MetalmendError):
    """The caller may not do this (RBAC said no)."""

    default_reason = "Forbidden"


class Invalid(MetalmendError):
    """The request itself is wrong (a parameter, a document); asking again will not help."""

    default_reason = "BadRequest"


class Unavailable(MetalmendError):
    """Something this depends on cannot be reached now; asking later may succeed."""

    default_reason = "ServiceUnavailable"


class Failed(MetalmendError):
    """The work was tried and did not succeed (a step's own failure, named by ``reason``)."""

    default_reason = "InternalError"
