"""shutdown-kubelet (docs/teardown.md): label the Node so that the shutdown-kubelet
DaemonSet (deploy/teardown/shutdown-kubelet.yaml) stops and disables its kubelet, then
wait until the kubelet is seen stopped. The rules are ``metalmend.teardown.policy.shutdown``'s;
this module observes (the Node, its Lease, the DaemonSet's pods on it) and acts (one
label) through ``KubeletWriter``. Nothing is remembered between requests: asking again
after an interruption labels nothing new and watches the heartbeat again.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.errors import Failed, Message, notes
from metalmend.errors import errors as error_lines
from metalmend.kube import errors
from metalmend.log import fields
from metalmend.teardown.drain import get_node, write_refused
from metalmend.teardown.policy import shutdown as policy
from metalmend.teardown.policy.settings import (
    DECOMMISSION_LABEL,
    DECOMMISSION_VALUE,
    SHUTDOWN_KUBELET_APP,
    TeardownSettings,
)

log = logging.getLogger(__name__)

LEASE_NAMESPACE = "kube-node-lease"
REASON = "ShutdownKubeletError"


class KubeletWriter(Protocol):
    """The one change shutdown-kubelet makes."""

    async def label_node(self, node: str, labels: dict[str, str]) -> None:
        """Set these labels (only these) on the Node; raises ApiError (404: no Node)."""


class KubeKubeletWriter:
    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def label_node(self, node: str, labels: dict[str, str]) -> None:
        body = {"metadata": {"labels": labels}}
        await self.client.patch(Node, node, body, patch_type=PatchType.MERGE)


@dataclass
class Heartbeat:
    """The kubelet's heartbeat as this request saw it: the value, and since when (our
    clock) it has not changed."""

    value: str | None = None
    since: dt.datetime | None = None
    moved: bool = False
    looked: bool = False


class KubeletShutdown:
    def __init__(
        self,
        client: AsyncClient,
        settings: TeardownSettings,
        writer: KubeletWriter | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.client = client
        self.settings = settings
        self.writer = writer or KubeKubeletWriter(client)
        self.clock = clock

    async def shutdown(self, name: str) -> list[Message]:
        """Shut down the kubelet of Node ``name``: the messages of a success, or
        NotFound, or Failed (reason ShutdownKubeletError)."""
        await get_node(self.client, name)  # 404 before anything is changed
        deadline = self.clock.now() + dt.timedelta(seconds=self.settings.shutdown_kubelet_timeout)
        heartbeat = Heartbeat()
        done: list[Message] = []
        while True:
            view = await self.observe(name, heartbeat, deadline)
            decision = policy.decide(view, self.clock.now(), self.settings)
            for action in decision.actions:
                match action:
                    case policy.LabelForShutdown(node=node, labels=labels):
                        await self._label(node, dict(labels))
                        done.append(
                            Message(f"node/{node} labelled {DECOMMISSION_LABEL}=enabled", False)
                        )
                    case policy.KubeletStopped(node=node, why=why):
                        log.info("kubelet stopped", extra=fields(node=node, why=why))
                        return [*done, *notes(f"node/{node} kubelet stopped: {why}")]
                    case policy.ShutdownFailed(node=node, problems=problems):
                        raise Failed(
                            f"the kubelet of Node {node} was not seen stopped within"
                            f" {self.settings.shutdown_kubelet_timeout:g} s",
                            [*done, *error_lines(*problems)],
                            reason=REASON,
                        )
                    case _:
                        pass  # an Event: this step reports in its answer
            if decision.requeue_at is not None:
                wait = (decision.requeue_at - self.clock.now()).total_seconds()
                await asyncio.sleep(max(0.0, wait))

    async def observe(
        self, name: str, heartbeat: Heartbeat, deadline: dt.datetime
    ) -> policy.ShutdownView:
        node = await get_node(self.client, name)
        labels = (node.metadata.labels if node.metadata else None) or {}
        value = await self._lease_renewal(name) or _ready_heartbeat(node)
        now = self.clock.now()
        if not heartbeat.looked or value != heartbeat.value:
            heartbeat.moved = heartbeat.looked
            heartbeat.value, heartbeat.since, heartbeat.looked = value, now, True
        return policy.ShutdownView(
            node=name,
            labelled=labels.get(DECOMMISSION_LABEL) == DECOMMISSION_VALUE,
            heartbeat=heartbeat.value,
            heartbeat_seen_since=heartbeat.since,
            heartbeat_moved=heartbeat.moved,
            ready_unknown=_ready(node) == "Unknown",
            deadline=deadline,
            shutdown_pods=tuple(await self._shutdown_pods(name)),
        )

    async def _label(self, node: str, labels: dict[str, str]) -> None:
        try:
            await self.writer.label_node(node, labels)
        except ApiError as error:
            raise write_refused(error, node, f"label Node {node}", REASON, listed=True) from None

    async def _lease_renewal(self, name: str) -> str | None:
        try:
            lease = await self.client.get(Lease, name, namespace=LEASE_NAMESPACE)
        except ApiError as error:
            if errors.is_not_found(error):
                return None
            raise
        renewed = lease.spec.renewTime if lease.spec else None
        return _text(renewed) if renewed is not None else None

    async def _shutdown_pods(self, name: str) -> list[str]:
        """One line per pod of the shutdown-kubelet DaemonSet meant for the Node, bound to it
        or not yet (the DaemonSet controller pins each pod to its Node by node affinity):
        for a failure's diagnosis (absent, unschedulable and why, pending, running)."""
        found = []
        listed = self.client.list(
            Pod, namespace=ALL_NS, labels={"app.kubernetes.io/name": SHUTDOWN_KUBELET_APP}
        )
        async for pod in listed:
            wire = pod.to_dict()
            if name in _meant_for(wire):
                found.append(_describe(wire))
        return found


def _text(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


def _conditions(node: Node) -> list[Any]:
    return list((node.status.conditions if node.status else None) or [])


def _ready(node: Node) -> str | None:
    return next((c.status for c in _conditions(node) if c.type == "Ready"), None)


def _ready_heartbeat(node: Node) -> str | None:
    """A kubelet without a Lease (clusters before NodeLease): its status heartbeat."""
    stamp = next((c.lastHeartbeatTime for c in _conditions(node) if c.type == "Ready"), None)
    return _text(stamp) if stamp is not None else None


def _meant_for(pod: dict[str, Any]) -> set[str]:
    """The Nodes a pod is bound or pinned to (``spec.nodeName``, or the DaemonSet
    controller's required ``matchFields`` on ``metadata.name``)."""
    spec = pod.get("spec") or {}
    nodes = {spec["nodeName"]} if spec.get("nodeName") else set()
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    for term in affinity.get("nodeSelectorTerms") or []:
        for field in term.get("matchFields") or []:
            if field.get("key") == "metadata.name" and field.get("operator") == "In":
                nodes.update(field.get("values") or [])
    return nodes


def _describe(pod: dict[str, Any]) -> str:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    line = f"shutdown-kubelet pod {meta.get('namespace')}/{meta.get('name')} is"
    line += f" {status.get('phase') or 'Pending'}"
    if not spec.get("nodeName"):
        scheduled: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "PodScheduled"), {}
        )
        why = scheduled.get("message") or "not scheduled yet"
        return f"{line}, not scheduled: {why}"
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            line += f": {waiting['reason']} {waiting.get('message') or ''}".rstrip()
    return line
