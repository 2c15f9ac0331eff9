"""What a site action's step is given and may raise (docs/site-actions.md): the interface
between the action worker and the steps it runs.

A step is an ``async`` function of a ``StepContext`` returning its closing note. It must be
idempotent given its record: the worker runs it again after a restart with the record it
last saved (``ctx.record``). ``StepFailed`` fails the step with the operator's message;
``MissingPrecondition`` is the spec's "fail due to a missing precondition" (nothing was
touched).

A step waits with ``ctx.pause(seconds)``, never ``asyncio.sleep``: a pause is where a stop
asked for through the API interrupts the step (``Stopped``), so a step must be safe to end
at each of its pauses (what it started is recorded, or goes on by itself). What it does
between two pauses (an apply, an etcd member add) finishes before a stop takes effect.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from lightkube import AsyncClient

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.designs.store import DesignStore
from metalmend.destroy.store import TaskStore
from metalmend.kube.events import EventRecorder
from metalmend.kube.impersonate import Who
from metalmend.kube.rbac import Caller, Permission
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend.teardown.drain import Drainer
from metalmend.teardown.interlock import Interlock
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.teardown.shutdown import KubeletShutdown


class Authorizer(Protocol):
    """Asks RBAC whether a caller may (the gate of metalmend serve); raises
    ``metalmend.errors.Refused`` when not."""

    async def authorize(self, caller: Caller, permission: Permission, name: str) -> None: ...


class Waker(Protocol):
    """A worker that looks for new work when woken (Drydock's task worker)."""

    def wake(self) -> None: ...


@dataclass(frozen=True)
class SiteServices:
    """What the worker gives every step, built once by the application (``metalmend.serve``)."""

    client: AsyncClient
    design_store: DesignStore
    task_store: TaskStore
    interlock: Interlock  # the teardown claim (docs/design.md, invariant 7)
    events: EventRecorder
    drainer: Drainer
    kubelet: KubeletShutdown
    teardown: TeardownSettings
    gate: Authorizer
    impersonate: Callable[..., AsyncClient]  # kube.impersonate.impersonator
    task_worker: Waker | None = None
    clock: Clock = SYSTEM_CLOCK
    redeploy: RedeploySettings = field(default_factory=RedeploySettings)
    site_namespaces: tuple[str, ...] = ()
    etcd_credentials_secrets: tuple[str, ...] = ()
    site_label_prefixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Action:
    """A stored action as its steps read it."""

    id: str
    name: str
    parameters: Mapping[str, Any] = field(default_factory=dict)
    user: str = ""
    context_marker: str | None = None
    revision: int | None = None  # the design revision the action uses (design_lookup's)
    allow_intermediate_commits: bool = False
    states: Mapping[str, str] = field(default_factory=dict)  # step -> its state, when started
    caller: Who | None = None  # who created it (None: an action stored before this was kept)


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@dataclass(frozen=True)
class StepContext:
    action: Action
    step: str
    record: Mapping[str, Any]  # this step's saved JSON record ({} the first time)
    save: Callable[[Mapping[str, Any]], Awaitable[None]]  # lease-conditional
    note: Callable[[str], Awaitable[None]]  # appends a note (stored, shown live)
    services: SiteServices
    # Waits ``seconds``, or raises ``Stopped`` as soon as the action is asked to stop.
    pause: Callable[[float], Awaitable[None]] = _sleep


class StepFailed(Exception):
    """The step failed; the message is the operator's."""


class Stopped(Exception):
    """The action was asked to stop while the step waited (``StepContext.pause``)."""


class MissingPrecondition(StepFailed):
    """The action cannot start: what it needs does not exist; nothing was touched."""


StepRunner = Callable[[StepContext], Awaitable[str]]  # returns its closing note


@dataclass(frozen=True)
class Planned:
    """A step of an action's plan. A ``final`` step runs even after an earlier one failed
    or the action was stopped (the site-action tag, as upstream's last task)."""

    name: str
    run: StepRunner
    final: bool = False
