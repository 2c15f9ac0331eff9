"""Destroying one node: observe, ``policy.destroy.decide``, act (docs/destroy.md,
docs/decide-act.md).

``DestroyNode.run`` loops until the node's record is finished: it observes the node's
BareMetalHost from the API server and, in the wipe step, the drives and their erases from
the BMC (through ``BmcPool``: the same bindings, slots and deadlines as power); asks the
policy; carries the actions out. Everything it remembers is the record the policy writes
(``SetState``, stored through ``save``): a replica that starts again, or takes the task
over, continues from it. What an action's execution learns (the claim refused, an erase
accepted and its task monitor) is a fact of the next round's view, not a decision.

Never a power command: powering off is ``spec.online: false`` on the host, which
host-power (``metalmend run``) carries out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Secret
from lightkube.types import PatchType

from metalmend.api.reboot import is_reboot_annotation
from metalmend.api.resources import BareMetalHost
from metalmend.api.storage import Drive, inventory_from_metal3, with_inventory
from metalmend.bmc import BmcTarget
from metalmend.bmc.credentials import lookup_read
from metalmend.bmc.errors import BmcError, Busy, TimedOut, Unreachable, Unsupported
from metalmend.bmc.storage import EraseFailed, EraseStatus
from metalmend.bmc.target import host_bmc
from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db.lease import LeaseLost
from metalmend.destroy import metrics
from metalmend.destroy.model import Task
from metalmend.destroy.policy import destroy as policy
from metalmend.destroy.policy.rootdevice import RootDeviceHints, os_drive
from metalmend.errors import Conflict, NotFound
from metalmend.kube import errors
from metalmend.kube.events import EventRecorder
from metalmend.kube.store import split_key
from metalmend.log import fields
from metalmend.teardown.interlock import Interlock

log = logging.getLogger(__name__)

PASSING = (Busy, Unreachable, TimedOut)  # the BMC may answer later: asked again


class DrivePool(Protocol):
    """The BMC calls a destroy makes (``metalmend.bmc.BmcPool``): drives, never power."""

    async def drives(self, target: BmcTarget) -> list[Drive]: ...

    async def start_erase(self, target: BmcTarget, drive_id: str) -> str | None: ...

    async def erase_status(
        self, target: BmcTarget, drive_id: str, monitor: str | None = None
    ) -> EraseStatus: ...


Save = Callable[[policy.NodeState], Awaitable[bool]]


class HostChanges:
    """Wakes a destroy when its host changes: a watch of that one BareMetalHost, so that
    host-power's report of the power-off (and of the release) is acted on at once, not at
    the next ``poll_interval``; the poll stays the upper bound (a BMC's erase can only be
    polled, and a watch that cannot run, for lack of the ``watch`` permission on an older
    installation, leaves the poll alone, said once in the log)."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client
        self.key: str | None = None
        self.task: asyncio.Task[None] | None = None
        self.changed = asyncio.Event()
        self.watches = 0  # watches started (tests count them)

    def follow(self, key: str) -> None:
        if key == self.key:
            return
        self.close()
        self.key = key
        self.watches += 1
        self.task = asyncio.create_task(self._watch(*split_key(key)), name=f"host {key}")

    async def _watch(self, namespace: str | None, name: str) -> None:
        try:
            async for _ in self.client.watch(
                BareMetalHost, namespace=namespace, fields={"metadata.name": name}
            ):
                self.changed.set()
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.info(
                "destroy: not watching the host, polling it",
                extra=fields(host=f"{namespace}/{name}", error=str(error)),
            )

    async def wait(self, seconds: float) -> None:
        """Until the host changes, or ``seconds`` pass."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.changed.wait(), max(0.0, seconds))
        self.changed.clear()

    def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self.key = None


@dataclass(frozen=True)
class DestroyNodes:
    """The task worker's runner (``destroy.worker.NodeRunner``): makes the destroy of one
    node of a task from what every destroy shares, built once by ``metalmend serve``'s
    composition root (``metalmend.serve.root``)."""

    client: AsyncClient
    pool: DrivePool
    claims: Interlock
    events: EventRecorder
    settings: policy.DestroySettings
    clock: Clock = SYSTEM_CLOCK

    def __call__(self, task: Task, node: str, state: policy.NodeState, save: Save) -> DestroyNode:
        return DestroyNode(
            self.client, self.pool, self.claims, self.events, self.settings, node=node,
            preserve=task.preserve_local_storage, by=task.created_by, state=state,
            save=save, clock=self.clock,
        )  # fmt: skip


class DestroyNode:
    def __init__(
        self,
        client: AsyncClient,
        pool: DrivePool,
        claims: Interlock,
        events: EventRecorder,
        settings: policy.DestroySettings,
        *,
        node: str,
        preserve: bool,
        by: str,
        state: policy.NodeState,
        save: Save,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client, self.pool, self.claims, self.events = client, pool, claims, events
        self.settings, self.clock = settings, clock
        self.node, self.preserve, self.by = node, preserve, by
        self.state, self.save = state, save
        # Facts learnt by the last round's actions, for the next round's view.
        self.refused = ""
        self.accepted: dict[str, str] = {}
        self.start_failed: dict[str, str] = {}
        self.bmc_error = ""
        self.host: Any | None = None
        self.changes = HostChanges(client)

    async def run(self) -> policy.NodeState:
        try:
            while not self.state.finished:
                metrics.destroy_seen(self, self.state, self.clock.now())
                view = await self.observe()
                now = self.clock.now()
                decision = policy.decide(view, now, self.settings)
                self.refused, self.accepted, self.start_failed = "", {}, {}
                for action in decision.actions:
                    if not await self.act(action):
                        break  # the next round decides from what this one learnt
                if self.state.finished:
                    break
                if self.state.host:
                    self.changes.follow(self.state.host)
                wait = (decision.requeue_at - now).total_seconds() if decision.requeue_at else 1.0
                await self.changes.wait(min(wait, self.settings.poll_interval))
        finally:
            self.changes.close()
        metrics.destroy_seen(self, self.state, self.clock.now())
        return self.state

    # ---- observe ----------------------------------------------------------------------------

    async def observe(self) -> policy.View:
        self.bmc_error = ""
        host, problem = await self._host()
        self.host = host
        facts = _host_facts(host) if host is not None else None
        view = policy.View(
            self.node, self.preserve, self.state, host=facts, host_problem=problem,
            refused=self.refused, accepted=dict(self.accepted),
            start_failed=dict(self.start_failed),
        )  # fmt: skip
        if host is None or self.state.step is not policy.Step.WIPE:
            return view
        return await self._observe_bmc(view, host)

    async def _host(self) -> tuple[Any | None, str]:
        """The node's host: the one on record once claimed, else the Node's (api/links)."""
        if self.state.host:
            return await self._read_host(self.state.host)
        try:
            node = await self.client.get(Node, self.node)
        except ApiError as error:
            if errors.is_not_found(error):
                return None, f"no Node named {self.node}"
            raise
        keys = await self.claims.host_keys(node)
        if not keys:
            return None, (
                f"Node {self.node} has no BareMetalHost (its providerID names none): metalmend"
                " cannot power off, wipe or release it"
            )
        if len(keys) > 1:
            return None, f"Node {self.node} has {len(keys)} BareMetalHosts ({', '.join(keys)})"
        return await self._read_host(keys[0])

    async def _read_host(self, key: str) -> tuple[Any | None, str]:
        namespace, name = split_key(key)
        try:
            return await self.client.get(BareMetalHost, name, namespace=namespace), ""
        except ApiError as error:
            if errors.is_not_found(error):
                return None, f"BareMetalHost {key} not found"
            raise

    async def _observe_bmc(self, view: policy.View, host: Any) -> policy.View:
        try:
            target = await self._target(host)
            if not self.state.planned:
                return await self._observe_drives(view, host, target)
            return await self._observe_erases(view, target)
        except Unsupported as error:
            return _with(view, cannot_erase=str(error))
        except (BmcError, Busy) as error:
            log.info("destroy: BMC", extra=fields(node=self.node, error=str(error)))
            return _with(view, bmc_error=str(error))

    async def _observe_drives(self, view: policy.View, host: Any, target: BmcTarget) -> policy.View:
        storage = ((host.get("status") or {}).get("hardware") or {}).get("storage")
        drives = with_inventory(await self.pool.drives(target), inventory_from_metal3(storage))
        facts = tuple(policy.DriveFacts(d.id, d.name, d.serial_number) for d in drives)
        if not self.preserve:
            return _with(view, drives=facts)
        hints = RootDeviceHints.from_wire((host.get("spec") or {}).get("rootDeviceHints"))
        chosen = os_drive(hints, drives)
        if isinstance(chosen, str):
            return _with(view, drives=facts, os_problem=chosen)
        return _with(view, drives=facts, os_drive=chosen.id)

    async def _observe_erases(self, view: policy.View, target: BmcTarget) -> policy.View:
        seen: dict[str, policy.SeenErase] = {}
        problems = []
        for record in self.state.drives:
            if record.erase not in (policy.Erase.REQUESTED, policy.Erase.RUNNING):
                continue
            if record.id in self.accepted:
                continue  # accepted a moment ago: recorded running first
            try:
                status = await self.pool.erase_status(target, record.id, record.monitor or None)
            except EraseFailed as error:
                seen[record.id] = policy.SeenErase(policy.Seen.FAILED, str(error))
                continue
            except PASSING as error:
                problems.append(str(error))
                continue
            state = policy.Seen.FINISHED if status.finished else policy.Seen.RUNNING
            seen[record.id] = policy.SeenErase(state)
        return _with(view, erases=seen, bmc_error="; ".join(problems))

    async def _target(self, host: Any) -> BmcTarget:
        """The host's BMC and credentials: its Secret read now (no cache in serve), with
        the same checks as host-power (labelled, bound to this host: docs/security.md).
        Not kept in a namespace's line at a busy endpoint: nobody wakes a destroy."""
        bmc = host_bmc(host)
        secret_name, secret = bmc.credentials_name, None
        if isinstance(secret_name, str) and secret_name and "/" not in secret_name:
            try:
                secret = await self.client.get(Secret, secret_name, namespace=bmc.namespace)
            except ApiError as error:
                if not errors.is_not_found(error):
                    raise
        credentials = lookup_read(bmc.namespace, bmc.name, secret_name, secret)
        return bmc.target(credentials, in_line=False)

    # ---- act --------------------------------------------------------------------------------

    async def act(self, action: policy.Action) -> bool:
        """Carry one action out; False: stop this round (the next one decides again)."""
        match action:
            case policy.Claim(step):
                return await self._claim(step)
            case policy.SetState(state):
                if not await self.save(state):
                    raise LeaseLost(self.node)
                self.state = state
            case policy.SetOnline(host, online):
                await self._patch(host, {"spec": {"online": online}})
            case policy.ClearConsumer(host):
                await self._patch(host, {"spec": {"consumerRef": None, "image": None}})
            case policy.SetProvisioningState(host, state):
                await self._patch(host, {"status": {"provisioning": {"state": state}}}, True)
            case policy.StartErase(_, drive):
                await self._start_erase(drive)
            case policy.Event(kind, reason, message):
                await self._event(str(kind), reason, message)
        return True

    async def _claim(self, step: str) -> bool:
        try:
            await self.claims.claim(self.node, step, self.by)
        except (NotFound, Conflict) as error:
            self.refused = error.message
            return False
        return True

    async def _patch(self, key: str, body: Mapping[str, Any], status: bool = False) -> None:
        namespace, name = split_key(key)
        resource: Any = BareMetalHost.Status if status else BareMetalHost
        await self.client.patch(
            resource, name, dict(body), namespace=namespace, patch_type=PatchType.MERGE
        )

    async def _start_erase(self, drive: str) -> None:
        if self.host is None:
            return
        try:
            monitor = await self.pool.start_erase(await self._target(self.host), drive)
        except (Unsupported, EraseFailed) as error:
            self.start_failed[drive] = str(error)
        except (BmcError, Busy) as error:  # not known to have started: asked again
            log.info("destroy: erase not started", extra=fields(node=self.node, error=str(error)))
        else:
            self.accepted[drive] = monitor or ""

    async def _event(self, kind: str, reason: str, message: str) -> None:
        """On the host and on the Node (``kubectl describe`` of either tells the story)."""
        if self.host is not None:
            await self.events.record(self.host, kind, reason, message)
        try:
            node = await self.client.get(Node, self.node)
        except ApiError:
            return  # gone (removed from the cluster): the host has the story
        await self.events.record(node, kind, reason, message)


def _with(view: policy.View, **changes: Any) -> policy.View:
    return replace(view, **changes)


def _host_facts(host: Any) -> policy.HostFacts:
    spec = host.get("spec") or {}
    status = host.get("status") or {}
    powered = status.get("poweredOn")
    provisioning = status.get("provisioning") or {}
    annotations = dict(host.metadata.annotations or {})
    error = status.get("errorMessage") if status.get("errorType") else ""
    return policy.HostFacts(
        key=f"{host.metadata.namespace}/{host.metadata.name}",
        online=spec.get("online") is True,
        powered_on=powered if isinstance(powered, bool) else None,
        power_error=error if isinstance(error, str) else "",
        provisioning_state=str(provisioning.get("state") or ""),
        consumer=bool(spec.get("consumerRef")),
        image=bool(spec.get("image")),
        reboot_keys=tuple(sorted(k for k in annotations if is_reboot_annotation(k))),
    )
