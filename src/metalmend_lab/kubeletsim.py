"""The lab's kubelet simulator: one per host, bound to that host's power.

After power-on and a boot delay it registers its Node (labels, providerID, capacity),
renews its Lease, reports Ready and runs the pods bound to it (pretend containers, real
pod status); while the host is off, or its kernel hung, it is silent; a power cycle
clears a hang and restarts the pods.

The shutdown-kubelet DaemonSet (deploy/teardown/shutdown-kubelet.yaml) is honoured as on a
real server: once its pod lands on this Node (the lab's controller-manager runs the
DaemonSet controller and its scheduler binds the pod), the kubelet starts the pod, then
stops and stays stopped ("disabled"), so its Lease is no longer renewed. The disabled
unit is a file on the host's OS drive (``lab.osdrive``): it survives power cycles and a
restart of the hardware process, and goes with the OS drive's wipe, so that a redeployed
server's kubelet runs again.

A host whose OS drive holds no OS (wiped by destroy, not provisioned yet) boots to
nothing: its kubelet is silent ("no-os") until the provisioner (``lab.provisioner``) has
written the OS, then boots it (the boot delay counted from then: Ironic reboots the host
into the OS it wrote).

A pod being deleted stops as on a real server (the kubelet's graceful termination): its
pretend containers get SIGTERM and exit after the seconds its annotation
``lab.metalmend.dev/slow-stop-seconds`` asks (at once without it), or are killed when its
deletion grace period runs out, whichever comes first; meanwhile the pod stays Running, not
Ready. Then its status shows the containers terminated and the pod is removed (grace 0,
uid precondition). Every stopping pod waits in a task of its own, so a Node's 300 pods stop
together, not one after another.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import functools
import hashlib
import itertools
import logging
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod

from metalmend.kube import errors
from metalmend.kube.writes import delete_exact
from metalmend.teardown.policy.settings import SHUTDOWN_KUBELET_APP
from metalmend_lab.inventory import HostSpec
from metalmend_lab.osdrive import OsDrive
from metalmend_lab.sitedesign import node_labels

log = logging.getLogger("metalmend_lab.kubeletsim")

HEARTBEAT = 1.0  # seconds between Lease renewals (a real kubelet: 10 s, for a 40 s grace)
STATUS_EVERY = 5.0  # seconds between Node status posts while healthy

# What every lab Node offers the scheduler. Room for 500 pods (a kubelet's --max-pods;
# 110 by default): benchmarks/drain.py puts 300 on one Node.
NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "500", "ephemeral-storage": "100Gi"}
_POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
_pod_ips = itertools.count()  # unique in the hardware process, so across the lab's hosts

# How long a pod's pretend containers take to exit after SIGTERM, in seconds (a decimal
# number; absent: they exit at once, as most programs do). Never longer than the pod's
# deletion grace period: then they are killed. A lab-only annotation: makes drains take
# realistic time (README, "The lab").
SLOW_STOP_ANNOTATION = "lab.metalmend.dev/slow-stop-seconds"
# Beyond this the annotation is taken for a mistake, not a workload: read as the default.
SLOW_STOP_LIMIT = 3600.0
# API writes of stopping pods at once, per kubelet: 300 pods stop together without
# opening 300 connections to the API server.
STOP_WRITES = 16


def _next_pod_ip() -> str:
    n = next(_pod_ips)
    return f"127.0.{1 + n // 254}.{1 + n % 254}"


def _iso(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def slow_stop_seconds(annotations: Mapping[str, Any] | None) -> float:
    """Seconds the pod's containers take to exit after SIGTERM, from its
    ``SLOW_STOP_ANNOTATION``; 0 without it or when it is not a number from 0 to
    ``SLOW_STOP_LIMIT`` (the lab must not crash, nor hold a pod for ever, on a typo)."""
    raw = (annotations or {}).get(SLOW_STOP_ANNOTATION)
    if raw is None:
        return 0.0
    try:
        seconds = float(str(raw))
    except ValueError:
        return 0.0
    return seconds if 0.0 <= seconds <= SLOW_STOP_LIMIT else 0.0  # NaN fails both


class Ending(enum.StrEnum):
    """How a stopping pod's containers end."""

    EXITED = "exited"  # on SIGTERM, within the grace period
    KILLED = "killed"  # still running when the grace period ran out: SIGKILL
    LOST = "lost"  # they died with the power (the pod ran in an earlier boot)


# (exit code, reason) a container's terminated state shows for each ending.
_TERMINATED = {
    Ending.EXITED: (0, "Completed"),
    Ending.KILLED: (137, "Error"),
    Ending.LOST: (255, "Unknown"),
}


@dataclass(frozen=True)
class Stop:
    """When a deleted pod's containers are gone, and how they end."""

    at: dt.datetime
    ending: Ending


def plan_stop(meta: Mapping[str, Any], now: dt.datetime, *, lost_with_power: bool = False) -> Stop:
    """When the containers of the pod being deleted (``meta``: its metadata) stop, seen by
    this kubelet at ``now``.

    Counted from when its deletion began, which the pod itself says (deletionTimestamp
    minus deletionGracePeriodSeconds), so that a kubelet restarted in the middle of a pod's
    termination stops it when it would have stopped anyway. The API server keeps whole
    seconds: the deletion began within the second after that. SIGTERM is sent when this
    kubelet sees the deletion within that second (as a real kubelet sends it on sight),
    else at its end: a stop is never early, and at most 1 s late."""
    if lost_with_power:
        return Stop(now, Ending.LOST)
    grace = meta.get("deletionGracePeriodSeconds")
    # Clamped: the API server accepts any int64, a timedelta does not.
    grace = min(max(grace, 0), 10**9) if isinstance(grace, int) else 0
    stamp = _timestamp(meta.get("deletionTimestamp"))
    began = now if stamp is None else stamp - dt.timedelta(seconds=grace)
    sigterm = max(began, min(now, began + dt.timedelta(seconds=1)))
    takes = slow_stop_seconds(meta.get("annotations"))
    if takes <= grace:
        return Stop(sigterm + dt.timedelta(seconds=takes), Ending.EXITED)
    return Stop(sigterm + dt.timedelta(seconds=grace), Ending.KILLED)


def _timestamp(value: Any) -> dt.datetime | None:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclass
class _RunningPod:
    """A pod whose containers this kubelet started, and in which boot."""

    boot: int
    container_ids: dict[str, str]


class KubeletSim:
    """Registers, heartbeats and reports Ready exactly while its host is on and well, and
    runs the pods bound to its Node as a kubelet would (their containers are pretend).

    Every heartbeat while running, one list of the pods bound to the Node: a pod not yet
    started in this boot is started (a new boot restarts every container, restartCount + 1);
    a started pod whose reported status someone else changed (the node-lifecycle controller
    marks pods not Ready when the Node goes Unknown) gets its status again, as the status
    manager's reconcile does; a pod being deleted is stopped by a task of its own
    (``plan_stop``: SIGTERM, then exit or SIGKILL), which reports its containers terminated
    and removes it (grace 0, uid precondition), as the kubelet does once its containers
    stopped. While off, booting, hung or disabled: nothing, and stops under way are
    abandoned (nothing runs on the host to finish them; the next boot does)."""

    def __init__(
        self,
        spec: HostSpec,
        powered: Callable[[], Awaitable[int | None]],
        os_drive: OsDrive | None = None,
    ) -> None:
        self.spec = spec
        self.powered = powered  # None while off, else the boot number
        # The host's OS drive: its OS and the kubelet's disabled unit live there. None (a
        # kubelet simulated without hardware): always an OS, disabled kept in memory.
        self.os_drive = os_drive
        self.hung = False
        self._disabled = False
        self.boot: int | None = None
        self.state = "off"  # off, no-os, booting, running, hung, disabled
        self._booted_at: float | None = None
        self._registered = False
        self._last_status = 0.0
        self._pods: dict[str, _RunningPod] = {}  # by pod uid
        self._stopping: dict[str, asyncio.Task[None]] = {}  # by pod uid
        self.most_stopping = 0  # the most pods ever stopping at once (tests read it)
        # Removed by this kubelet, maybe still in a list begun before: not stopped twice.
        self._removed: set[str] = set()
        self._writes = asyncio.Semaphore(STOP_WRITES)
        self._client = AsyncClient(KubeConfig.from_file(spec.kubeconfig))

    @property
    def disabled(self) -> bool:
        """`systemctl disable --now kubelet` ran on this host (and its OS was not wiped)."""
        return self.os_drive.kubelet_disabled if self.os_drive is not None else self._disabled

    @disabled.setter
    def disabled(self, value: bool) -> None:
        if self.os_drive is None:
            self._disabled = value
        else:
            self.os_drive.set_kubelet_disabled(value)

    def os_installed(self) -> bool:
        return self.os_drive is None or self.os_drive.installed() is not None

    @property
    def pods(self) -> int:
        """How many pods this host runs now (a hung kernel's still count; none while off)."""
        if self.state not in ("running", "hung"):
            return 0
        return sum(1 for pod in self._pods.values() if pod.boot == self.boot)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.beat()
                except (ApiError, httpx.HTTPError, httpx2.HTTPError, OSError) as error:
                    log.warning("kubelet %s: %s", self.spec.name, error)
                await asyncio.sleep(HEARTBEAT)
        finally:
            self._abandon_stops()

    async def beat(self) -> None:
        boot = await self.powered()
        if boot is None:
            self.state, self.boot = "off", None
            self._abandon_stops()
            return
        now = time.monotonic()
        if boot != self.boot:  # a new boot: whatever hung the old kernel is gone
            self.boot, self._booted_at, self._registered, self.hung = boot, now, False, False
            self.state = "booting"
        if not self.os_installed():
            # Nothing to boot: the host waits at its firmware until an OS is written, and
            # boots it from then (boot delay included) with a Node to register afresh.
            self.state, self._booted_at, self._registered = "no-os", now, False
            self._abandon_stops()
            return
        assert self._booted_at is not None
        if now - self._booted_at < self.spec.boot_delay:
            self.state = "booting"
            self._abandon_stops()
            return
        if self.hung:
            self.state = "hung"
            self._abandon_stops()
            return
        if self.disabled:
            self.state = "disabled"
            self._abandon_stops()
            return
        if self.state == "hung":
            self._last_status = 0.0  # back from a hang: report Ready at once
        self.state = "running"
        if not self._registered:
            await self._register()
        await self._renew_lease()
        if now - self._last_status >= STATUS_EVERY:
            await self._post_status()
            self._last_status = now
        await self._sync_pods(boot)

    # ---- the Node ----------------------------------------------------------------------

    def _labels(self) -> dict[str, str]:
        return node_labels(self.spec)  # the site design's labels for this Node

    def _node_status(self) -> dict[str, Any]:
        now = _now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "kubelet is posting ready status (metalmend lab)",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        pressures = [
            {
                "type": kind,
                "status": "False",
                "reason": f"KubeletHasNo{kind}",
                "message": f"no {kind} (metalmend lab)",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
        ]
        system_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.spec.name}.metalmend.lab"))
        return {
            "capacity": NODE_CAPACITY,
            "allocatable": NODE_CAPACITY,
            "conditions": [*pressures, ready],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": self.spec.name},
            ],
            "nodeInfo": {
                "machineID": system_id.replace("-", ""),
                "systemUUID": system_id,
                "bootID": str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.boot}.{system_id}")),
                "kernelVersion": "6.1.0-metalmend-lab",
                "osImage": "metalmend lab host",
                "containerRuntimeVersion": "metalmend-lab://0",
                "kubeletVersion": "v0.0.0-metalmend-lab",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }

    async def _register(self) -> None:
        node: Any = Node.from_dict(
            {
                "metadata": {"name": self.spec.name, "labels": self._labels()},
                "spec": {"providerID": self.spec.provider_id},
                "status": self._node_status(),
            }
        )
        try:
            await self._client.create(node)
        except ApiError as error:
            if not errors.is_conflict(error):  # already registered before the reboot
                raise
        self._registered = True
        self._last_status = 0.0

    async def _renew_lease(self) -> None:
        now = dt.datetime.now(dt.UTC)
        try:
            lease = await self._client.get(Lease, self.spec.name, namespace="kube-node-lease")
        except ApiError as error:
            if not errors.is_not_found(error):
                raise
            node: Any = await self._client.get(Node, self.spec.name)
            owner = OwnerReference(
                apiVersion="v1", kind="Node", name=self.spec.name, uid=node.metadata.uid
            )
            lease = Lease(
                metadata=ObjectMeta(
                    name=self.spec.name, namespace="kube-node-lease", ownerReferences=[owner]
                ),
                spec=LeaseSpec(
                    holderIdentity=self.spec.name, leaseDurationSeconds=40, renewTime=now
                ),
            )
            await self._client.create(lease)
            return
        lease.spec = LeaseSpec(
            holderIdentity=self.spec.name, leaseDurationSeconds=40, renewTime=now
        )
        await self._client.replace(lease)

    def _abandon_stops(self) -> None:
        """The host stopped running things (off, hung, disabled): so do its pods' stops."""
        for task in self._stopping.values():
            task.cancel()
        self._stopping.clear()

    def _stopped(self, uid: str, task: asyncio.Task[None]) -> None:
        # Done: the pod is gone, or a write failed and the next sync starts it again.
        if self._stopping.get(uid) is task:
            del self._stopping[uid]

    async def _post_status(self) -> None:
        await self._client.patch(Node.Status, self.spec.name, {"status": self._node_status()})

    # ---- pods --------------------------------------------------------------------------

    async def _sync_pods(self, boot: int) -> None:
        seen: set[str] = set()
        bound = self._client.list(Pod, namespace="*", fields={"spec.nodeName": self.spec.name})
        async for listed in bound:
            pod: dict[str, Any] = listed.to_dict()
            meta = pod["metadata"]
            seen.add(meta["uid"])
            try:
                await self._sync_pod(pod, boot)
            except ApiError as error:
                log.warning(
                    "kubelet %s: pod %s/%s: %s", self.spec.name, meta["namespace"], meta["name"],
                    error,
                )  # fmt: skip
        for uid in set(self._pods) - seen:
            del self._pods[uid]
        for uid in set(self._stopping) - seen:  # removed by someone else (force-deleted)
            self._stopping.pop(uid).cancel()
        self._removed &= seen

    async def _sync_pod(self, pod: dict[str, Any], boot: int) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        if meta.get("deletionTimestamp"):
            if uid not in self._stopping and uid not in self._removed:
                running = self._pods.get(uid)
                # The power cut killed them if they ran in an earlier boot: a real kubelet
                # finds nothing to stop.
                lost = running is not None and running.boot != boot
                stop = plan_stop(meta, dt.datetime.now(dt.UTC), lost_with_power=lost)
                task = asyncio.create_task(self._stop_pod(pod, stop))
                self._stopping[uid] = task
                self.most_stopping = max(self.most_stopping, len(self._stopping))
                task.add_done_callback(functools.partial(self._stopped, uid))
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        running = self._pods.get(uid)
        if running is None or running.boot != boot:
            if not await self._admits(pod):
                return
            running = _RunningPod(boot, {})
            self._pods[uid] = running
        elif _reported(status, running):
            return
        await self._client.patch(
            Pod.Status,
            meta["name"],
            {"metadata": {"uid": uid}, "status": _running_status(pod, running)},
            namespace=meta["namespace"],
        )
        if (meta.get("labels") or {}).get("app.kubernetes.io/name") == SHUTDOWN_KUBELET_APP:
            # What its container does on a real server: this kubelet stops for good.
            log.info("kubelet %s: disabled and stopped by %s", self.spec.name, meta["name"])
            self.disabled = True

    async def _admits(self, pod: dict[str, Any]) -> bool:
        """The kubelet's admission of a pod it is to start: its ``nodeSelector`` must match
        the Node's labels now, else it is rejected (Failed, NodeAffinity), as a real
        kubelet rejects it. It matters for a redeployed server: the shutdown-kubelet pod of
        the Node's former life is still bound to its name until the pod GC or the DaemonSet
        controller removes it, and must not disable the new kubelet."""
        meta, selector = pod["metadata"], pod["spec"].get("nodeSelector") or {}
        if not selector:
            return True
        node: Any = await self._client.get(Node, self.spec.name)
        labels = (node.metadata.labels if node.metadata else None) or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            return True
        log.info(
            "kubelet %s: pod %s/%s rejected: its nodeSelector does not match the Node",
            self.spec.name, meta["namespace"], meta["name"],
        )  # fmt: skip
        rejected = {
            "phase": "Failed",
            "reason": "NodeAffinity",
            "message": "Pod was rejected: Predicate NodeAffinity failed",
        }
        await self._write_status(meta["name"], meta["namespace"], meta["uid"], rejected)
        return False

    async def _stop_pod(self, pod: dict[str, Any], stop: Stop) -> None:
        """SIGTERM now: not Ready while the containers stop; at ``stop.at`` they are gone,
        which the pod's status shows, and the pod is removed if it still is this one."""
        meta, status = pod["metadata"], pod.get("status") or {}
        uid, name, namespace = meta["uid"], meta["name"], meta["namespace"]
        terminal = status.get("phase") in ("Succeeded", "Failed")  # nothing left to stop
        try:
            wait = 0.0 if terminal else (stop.at - dt.datetime.now(dt.UTC)).total_seconds()
            if wait > 0:
                if not _stopping_reported(status):
                    await self._write_status(name, namespace, uid, _stopping_status(status))
                log.info(
                    "kubelet %s: pod %s/%s stops in %.1f s (%s)",
                    self.spec.name, namespace, name, wait, stop.ending,
                )  # fmt: skip
                await asyncio.sleep(wait)
            if not terminal:
                await self._write_status(name, namespace, uid, _stopped_status(pod, stop))
            async with self._writes:
                await delete_exact(
                    self._client, Pod, name, uid, namespace=namespace, grace_period=0
                )
        except (ApiError, httpx.HTTPError, httpx2.HTTPError, OSError) as error:
            if isinstance(error, ApiError) and errors.is_not_found(error):
                return  # gone already (force-deleted): nothing to do
            log.warning(
                "kubelet %s: stopping pod %s/%s: %s", self.spec.name, namespace, name, error
            )
            return
        self._pods.pop(uid, None)
        self._removed.add(uid)

    async def _write_status(
        self, name: str, namespace: str, uid: str, status: dict[str, Any]
    ) -> None:
        async with self._writes:
            await self._client.patch(
                Pod.Status, name, {"metadata": {"uid": uid}, "status": status},
                namespace=namespace,
            )  # fmt: skip


def _reported(status: dict[str, Any], running: _RunningPod) -> bool:
    """The server shows the pod as this kubelet runs it: Running, Ready, our containers."""
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    ids = {c["name"]: c.get("containerID") for c in status.get("containerStatuses") or []}
    return (
        status.get("phase") == "Running"
        and all(conditions.get(kind) == "True" for kind in _POD_CONDITIONS)
        and ids == running.container_ids
    )


def _not_ready(kind: str, names: list[str], reason: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "False",
        "reason": reason,
        "message": f"containers with unready status: [{' '.join(names)}]",
        "lastTransitionTime": now,
    }


def _stopping_reported(status: dict[str, Any]) -> bool:
    """The server already shows the pod Running and not Ready (a restarted kubelet, or
    one back from a hang, does not post it again)."""
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    return status.get("phase") == "Running" and conditions.get("Ready") == "False"


def _stopping_status(status: dict[str, Any]) -> dict[str, Any]:
    """A terminating pod's status: still Running (its containers are), no longer Ready."""
    now = _now()
    containers = [{**c, "ready": False} for c in _jsonable(status.get("containerStatuses") or [])]
    names = [c["name"] for c in containers]
    return {
        "phase": status.get("phase") or "Pending",
        "conditions": [
            _not_ready(kind, names, "ContainersNotReady", now)
            for kind in ("ContainersReady", "Ready")
        ],
        "containerStatuses": containers,
    }


def _stopped_status(pod: dict[str, Any], stop: Stop) -> dict[str, Any]:
    """The pod's last status: every container terminated, the pod in a terminal phase
    (Succeeded when all exited 0, else Failed), as a kubelet reports it before the pod is
    removed (Kubernetes >= 1.27, "Pod Lifecycle")."""
    now = _now()
    code, reason = _TERMINATED[stop.ending]
    status = pod.get("status") or {}
    containers = []
    for before in _jsonable(status.get("containerStatuses") or []):
        running = (before.get("state") or {}).get("running") or {}
        terminated: dict[str, Any] = {"exitCode": code, "reason": reason, "finishedAt": now}
        if before.get("containerID"):
            terminated["containerID"] = before["containerID"]
        if running.get("startedAt"):
            terminated["startedAt"] = running["startedAt"]
        containers.append(
            {**before, "ready": False, "started": False, "state": {"terminated": terminated}}
        )
    names = [c["name"] for c in containers]
    return {
        "phase": "Succeeded" if code == 0 else "Failed",
        "conditions": [
            _not_ready(kind, names, "PodCompleted", now) for kind in ("ContainersReady", "Ready")
        ],
        "containerStatuses": containers,
    }


def _running_status(pod: dict[str, Any], running: _RunningPod) -> dict[str, Any]:
    """The status of ``pod`` with every container running in ``running``; containers not
    started yet in it are started now (a restart if they ran before)."""
    now = _now()
    spec, status = pod["spec"], pod.get("status") or {}
    previous = {c["name"]: c for c in status.get("containerStatuses") or []}
    containers = []
    for container in spec["containers"]:
        name, image = container["name"], container.get("image", "")
        before = previous.get(name) or {}
        entry: dict[str, Any] = {
            "name": name,
            "image": image,
            "imageID": f"{image}@sha256:{hashlib.sha256(image.encode()).hexdigest()}",
            "ready": True,
            "started": True,
            "restartCount": before.get("restartCount", 0),
        }
        ours = running.container_ids.get(name)
        if ours is not None and before.get("containerID") == ours:
            entry["containerID"] = ours
            entry["state"] = before.get("state") or {"running": {"startedAt": now}}
            if "lastState" in before:
                entry["lastState"] = before["lastState"]
        else:
            running.container_ids[name] = f"containerd://{secrets.token_hex(32)}"
            entry["containerID"] = running.container_ids[name]
            entry["state"] = {"running": {"startedAt": now}}
            if before.get("containerID"):  # it ran before this boot: a restart
                entry["restartCount"] += 1
                started = (before.get("state") or {}).get("running", {}).get("startedAt", now)
                entry["lastState"] = {
                    "terminated": {
                        "exitCode": 255,
                        "reason": "Unknown",
                        "containerID": before["containerID"],
                        "startedAt": _iso(started),
                        "finishedAt": now,
                    }
                }
        containers.append(_jsonable(entry))
    old_conditions = {c["type"]: c for c in status.get("conditions") or []}
    conditions = []
    for kind in ("PodScheduled", *_POD_CONDITIONS):
        old = old_conditions.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == "True" else None
        conditions.append(
            {"type": kind, "status": "True", "lastTransitionTime": _iso(since or now)}
        )
    pod_ip = status.get("podIP") or _next_pod_ip()
    result: dict[str, Any] = {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": _iso(status.get("startTime") or now),
        "containerStatuses": containers,
    }
    if init := spec.get("initContainers"):
        result["initContainerStatuses"] = [
            {
                "name": c["name"],
                "image": c.get("image", ""),
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"terminated": {"exitCode": 0, "reason": "Completed"}},
            }
            for c in init
        ]
    return result


def _jsonable(value: Any) -> Any:
    """Model values (datetimes) as the API writes them."""
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return _iso(value) if isinstance(value, dt.datetime) else value
