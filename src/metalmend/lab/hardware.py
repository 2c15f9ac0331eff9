"""The lab's servers: power, BMCs and kubelets, in one process (``python -m
metalmend.lab.hardware CONFIG``), started by ``metalmend lab up``.

Per host:
- power: for IPMI hosts it lives here (``HostPower``) behind a pyghmi BMC on its own UDP
  port; for Redfish hosts it lives in sushy-tools' emulator and is read through Redfish;
- a fault line in front of the BMC (UDP relay or TCP proxy) for bmc-down and bmc-slow;
- a kubelet simulator bound to that power: after power-on and a boot delay it registers
  its Node (labels, providerID, capacity), renews its Lease, reports Ready and runs the
  pods bound to it (pretend containers, real pod status); while the host is off, or its
  kernel hung, it is silent; a power cycle clears a hang and restarts the pods.

Faults arrive as files (``faults/<host>.json``) written by ``metalmend lab fault``; what
the hardware looks like is written to ``status.json`` for ``metalmend lab status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hashlib
import itertools
import json
import logging
import secrets
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node, Pod

from metalmend.kube.writes import delete_exact

log = logging.getLogger("metalmend.lab.hardware")

HEARTBEAT = 1.0  # seconds between Lease renewals (a real kubelet: 10 s, for a 40 s grace)
STATUS_EVERY = 5.0  # seconds between Node status posts while healthy
SLOW_DELAY = 3.0  # seconds a bmc-slow line adds each way


@dataclass
class HostSpec:
    name: str
    namespace: str
    bmc: str  # "redfish" or "ipmi"
    bmc_port: int  # what the BareMetalHost's address names (the fault line)
    internal_port: int  # the BMC itself (IPMI) or the emulator (Redfish)
    username: str
    password: str
    provider_id: str
    kubeconfig: str  # the node's own identity (system:node:<name>)
    system_id: str = ""  # Redfish system id
    boot_delay: float = 3.0
    power_delay: float = 0.0  # IPMI: seconds before a power change lands
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        if self.bmc == "ipmi":
            return f"ipmi://127.0.0.1:{self.bmc_port}"
        return f"redfish+https://127.0.0.1:{self.bmc_port}/redfish/v1/Systems/{self.system_id}"


@dataclass
class HardwareConfig:
    lab_dir: str
    hosts: list[HostSpec]
    ca_file: str = ""  # trusts the emulator's certificate

    @classmethod
    def read(cls, path: Path) -> HardwareConfig:
        data = json.loads(path.read_text())
        return cls(data["lab_dir"], [HostSpec(**h) for h in data["hosts"]], data["ca_file"])

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))
        path.chmod(0o600)


@dataclass
class Faults:
    hang: bool = False
    bmc: str = "up"  # up, down, slow
    ignore_soft: bool = False  # the BMC accepts soft power-off and does nothing

    @classmethod
    def read(cls, path: Path) -> Faults:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return cls()


def write_faults(lab_dir: Path, host: str, faults: Faults) -> None:
    path = faults_path(lab_dir, host)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(faults)))
    tmp.replace(path)


def faults_path(lab_dir: Path, host: str) -> Path:
    return lab_dir / "hardware" / "faults" / f"{host}.json"


def status_path(lab_dir: Path) -> Path:
    return lab_dir / "hardware" / "status.json"


# ---- IPMI hosts: power here, behind a pyghmi BMC ----------------------------------------


class HostPower:
    """The power of one IPMI host. Changes land ``delay`` seconds after the command, as on
    real hardware; the BMC thread and the kubelet read it concurrently."""

    def __init__(self, on: bool, delay: float, journal: Path | None = None) -> None:
        self.journal = journal  # every command received, with its wall-clock time
        self._lock = threading.Lock()
        self._on = on
        self.boots = 1 if on else 0  # power-ons so far: a new one is a new boot
        self._pending: tuple[bool, float] | None = None
        self.delay = delay
        self.ignore_soft = False

    def is_on(self) -> bool:
        with self._lock:
            if self._pending is not None and time.monotonic() >= self._pending[1]:
                if self._pending[0] and not self._on:
                    self.boots += 1
                self._on, self._pending = self._pending[0], None
            return self._on

    def boot(self) -> int | None:
        """None while off; otherwise which boot this is (changes with every power-on, however
        short the power was off)."""
        return self.boots if self.is_on() else None

    def request(self, on: bool, soft: bool = False) -> None:
        if self.journal is not None:
            action = "on" if on else ("soft off" if soft else "hard off")
            with self.journal.open("a") as journal:
                journal.write(f"{time.time():.6f} {action}\n")
        if soft and self.ignore_soft:
            return
        with self._lock:
            self._pending = (on, time.monotonic() + self.delay)
        self.is_on()


def _refuse_unsupported_ciphers(session_class: Any) -> None:
    """pyghmi's BMC implements only cipher suite 3 (HMAC-SHA1) but answers a request for
    suite 17 (SHA-256) as if it had agreed, so a client that asks for 17 first (pyghmi's
    own) fails in RAKP. A real BMC refuses an algorithm it lacks (RMCP+ status 0x04,
    invalid authentication algorithm) and the client falls back to suite 3; make the lab
    BMC do that."""
    original = session_class.create_open_session_response
    if getattr(original, "refuses_unsupported", False):
        return

    def create_open_session_response(self: Any, request: bytearray) -> bytearray:
        requested_auth = request[12] if len(request) > 12 else 1
        if requested_auth != 1:  # 1 = RAKP-HMAC-SHA1
            self.clientsessionid = request[4:8]
            return bytearray([request[0], 0x04, 0, 0]) + request[4:8] + bytearray(4)
        response: bytearray = original(self, request)
        return response

    create_open_session_response.refuses_unsupported = True  # type: ignore[attr-defined]
    session_class.create_open_session_response = create_open_session_response


def start_ipmi_bmcs(hosts: list[tuple[HostSpec, HostPower]]) -> threading.Thread | None:
    """All lab IPMI BMCs share pyghmi's session loop, in one daemon thread."""
    if not hosts:
        return None
    from pyghmi.ipmi import bmc as pyghmi_bmc
    from pyghmi.ipmi.private import serversession

    _refuse_unsupported_ciphers(serversession.ServerSession)

    class LabBmc(pyghmi_bmc.Bmc):  # type: ignore[misc]
        def __init__(self, spec: HostSpec, power: HostPower) -> None:
            super().__init__(
                {spec.username: spec.password}, port=spec.internal_port, address="127.0.0.1"
            )
            self.power = power

        def get_power_state(self) -> str:
            return "on" if self.power.is_on() else "off"

        def power_on(self) -> None:
            self.power.request(True)

        def power_off(self) -> None:
            self.power.request(False)

        def power_shutdown(self) -> None:
            self.power.request(False, soft=True)

        def power_reset(self) -> None:
            self.power.request(False)
            self.power.request(True)

        power_cycle = power_reset

    for spec, power in hosts:
        LabBmc(spec, power)
    thread = threading.Thread(target=pyghmi_bmc.Bmc.listen, name="ipmi-bmcs", daemon=True)
    thread.start()
    return thread


# ---- the kubelet simulator ----------------------------------------------------------------

# What every lab Node offers the scheduler.
NODE_CAPACITY = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
_POD_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")
_pod_ips = itertools.count()  # unique in the hardware process, so across the lab's hosts


def _next_pod_ip() -> str:
    n = next(_pod_ips)
    return f"127.0.{1 + n // 254}.{1 + n % 254}"


def _iso(value: Any) -> str:
    return value.isoformat() if isinstance(value, dt.datetime) else str(value)


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


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
    manager's reconcile does; a pod being deleted is removed (grace 0, uid precondition),
    as the kubelet does once its containers stopped. While off, booting or hung: nothing."""

    def __init__(self, spec: HostSpec, powered: Callable[[], Awaitable[int | None]]) -> None:
        self.spec = spec
        self.powered = powered  # None while off, else the boot number
        self.hung = False
        self.boot: int | None = None
        self.state = "off"  # off, booting, running, hung
        self._booted_at: float | None = None
        self._registered = False
        self._last_status = 0.0
        self._pods: dict[str, _RunningPod] = {}  # by pod uid
        self._client = AsyncClient(KubeConfig.from_file(spec.kubeconfig))

    @property
    def pods(self) -> int:
        """How many pods this host runs now (a hung kernel's still count; none while off)."""
        if self.state not in ("running", "hung"):
            return 0
        return sum(1 for pod in self._pods.values() if pod.boot == self.boot)

    async def run(self) -> None:
        while True:
            try:
                await self.beat()
            except (ApiError, httpx.HTTPError, httpx2.HTTPError, OSError) as error:
                log.warning("kubelet %s: %s", self.spec.name, error)
            await asyncio.sleep(HEARTBEAT)

    async def beat(self) -> None:
        boot = await self.powered()
        if boot is None:
            self.state, self.boot = "off", None
            return
        now = time.monotonic()
        if boot != self.boot:  # a new boot: whatever hung the old kernel is gone
            self.boot, self._booted_at, self._registered, self.hung = boot, now, False, False
            self.state = "booting"
        assert self._booted_at is not None
        if now - self._booted_at < self.spec.boot_delay:
            self.state = "booting"
            return
        if self.hung:
            self.state = "hung"
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
        return {
            "kubernetes.io/hostname": self.spec.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.spec.labels,
        }

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
            if error.status.code != 409:  # 409: already registered before the reboot
                raise
        self._registered = True
        self._last_status = 0.0

    async def _renew_lease(self) -> None:
        now = dt.datetime.now(dt.UTC)
        try:
            lease = await self._client.get(Lease, self.spec.name, namespace="kube-node-lease")
        except ApiError as error:
            if error.status.code != 404:
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

    async def _sync_pod(self, pod: dict[str, Any], boot: int) -> None:
        meta, status = pod["metadata"], pod.get("status") or {}
        uid = meta["uid"]
        if meta.get("deletionTimestamp"):
            # Its containers stop at once: the kubelet's status manager then deletes it
            # for good, only if it still is this pod.
            await delete_exact(
                self._client, Pod, meta["name"], uid, namespace=meta["namespace"], grace_period=0
            )
            self._pods.pop(uid, None)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        running = self._pods.get(uid)
        if running is None or running.boot != boot:
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


def _reported(status: dict[str, Any], running: _RunningPod) -> bool:
    """The server shows the pod as this kubelet runs it: Running, Ready, our containers."""
    conditions = {c["type"]: c["status"] for c in status.get("conditions") or []}
    ids = {c["name"]: c.get("containerID") for c in status.get("containerStatuses") or []}
    return (
        status.get("phase") == "Running"
        and all(conditions.get(kind) == "True" for kind in _POD_CONDITIONS)
        and ids == running.container_ids
    )


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


# ---- Redfish hosts: power in sushy-tools, read through Redfish ----------------------------


class RedfishPower:
    def __init__(self, spec: HostSpec, ca_file: str) -> None:
        context = ssl.create_default_context(cafile=ca_file)
        self._http = httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{spec.internal_port}",
            auth=(spec.username, spec.password),
            verify=context,
            timeout=5.0,
        )
        self._path = f"/redfish/v1/Systems/{spec.system_id}"
        self.last = False
        self.boots = 0

    async def boot(self) -> int | None:
        """As HostPower.boot, from Redfish's PowerState (the fake driver's changes take
        seconds, so every off is observed)."""
        try:
            answer = await self._http.get(self._path)
            on = answer.raise_for_status().json().get("PowerState") == "On"
            if on and not self.last:
                self.boots += 1
            self.last = on
        except (httpx.HTTPError, ValueError) as error:
            log.warning("cannot read power of %s: %s", self._path, error)
        return self.boots if self.last else None


# ---- the process ---------------------------------------------------------------------------


async def serve(config: HardwareConfig) -> None:
    from metalmend.lab.proxies import TcpProxy, UdpRelay

    lab_dir = Path(config.lab_dir)
    ipmi_hosts: list[tuple[HostSpec, HostPower]] = []
    kubelets: dict[str, KubeletSim] = {}
    lines: dict[str, TcpProxy | UdpRelay] = {}
    powers: dict[str, Callable[[], Awaitable[int | None]]] = {}
    ipmi_power: dict[str, HostPower] = {}
    for spec in config.hosts:
        if spec.bmc == "ipmi":
            journal = lab_dir / "hardware" / f"{spec.name}.commands"
            power = HostPower(on=True, delay=spec.power_delay, journal=journal)
            ipmi_hosts.append((spec, power))
            ipmi_power[spec.name] = power

            async def read_ipmi(power: HostPower = power) -> int | None:
                return power.boot()

            powers[spec.name] = read_ipmi
            lines[spec.name] = UdpRelay("127.0.0.1", spec.internal_port, spec.bmc_port)
        else:
            powers[spec.name] = RedfishPower(spec, config.ca_file).boot
            lines[spec.name] = TcpProxy("127.0.0.1", spec.internal_port, listen_port=spec.bmc_port)
        kubelets[spec.name] = KubeletSim(spec, powers[spec.name])
    start_ipmi_bmcs(ipmi_hosts)
    for line in lines.values():
        await line.start()
    tasks = [asyncio.create_task(k.run()) for k in kubelets.values()]
    log.info("hardware up: %d hosts", len(config.hosts))
    (lab_dir / "hardware" / "faults").mkdir(parents=True, exist_ok=True)
    hung_boot: dict[str, int | None] = {}  # which boot each hung host hung in
    while True:
        report: dict[str, Any] = {}
        for spec in config.hosts:
            faults = Faults.read(faults_path(lab_dir, spec.name))
            kubelet, line = kubelets[spec.name], lines[spec.name]
            if faults.hang and kubelet.boot != hung_boot.get(spec.name, kubelet.boot):
                faults.hang = False  # the host rebooted since it hung: the hang is gone
                write_faults(lab_dir, spec.name, faults)
            if faults.hang:
                hung_boot.setdefault(spec.name, kubelet.boot)
            else:
                hung_boot.pop(spec.name, None)
            kubelet.hung = faults.hang
            line.apply(down=faults.bmc == "down", delay=SLOW_DELAY if faults.bmc == "slow" else 0.0)
            if spec.name in ipmi_power:
                ipmi_power[spec.name].ignore_soft = faults.ignore_soft
            report[spec.name] = {
                "bmc": spec.bmc,
                "address": spec.address,
                "power": "on" if kubelet.state != "off" else "off",
                "kubelet": kubelet.state,
                "pods": kubelet.pods,
                "bmc_line": faults.bmc,
                "faults": asdict(faults),  # as applied: `lab fault` waits to see its own
            }
        tmp = status_path(lab_dir).with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=2))
        tmp.replace(status_path(lab_dir))
        for task in tasks:
            if task.done():
                task.result()
        await asyncio.sleep(0.2)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = HardwareConfig.read(Path(sys.argv[1]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))


if __name__ == "__main__":
    main()
