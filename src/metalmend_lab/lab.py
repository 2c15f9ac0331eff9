"""The lab: a real control plane (and, later, hosts) kept under one directory, ``.lab/``.

``up`` runs in the foreground until Ctrl-C or SIGTERM; ``up --detach`` starts that same
foreground process in its own session and returns once it is ready. The running lab is
described by ``.lab/lab.json`` (supervisor and component pids, ports), which is how ``down``
and ``status`` find it, and which lets ``down`` clean up even after the supervisor was
killed with SIGKILL.

The supervisor restarts ``metalmend run``, ``metalmend serve`` (servedeploy), the lab's
provisioner (lab.provisioner), beside baremetal-operator the stand-in for it
(lab.bmostandin), and the upstream machine-API controllers ``--machine-api`` runs (Cluster
API's manager, lab.capi; OpenShift's machine-healthcheck and nodelink-controller,
lab.openshift) when they die,
as a Deployment's kubelet would (CrashLoopBackOff, with lab-sized waits: 1 s doubling to
30 s, back to 1 s once it has run for a minute), so that crash tests can kill the
controller (or the service) of a lab as started by default. Restarts are logged and
counted in ``lab.json`` (``lab status`` shows them). Any other component dying still stops
the lab: nothing in the lab is expected to crash but us.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node

from metalmend.api.resources import CRD_DIR
from metalmend.kube.crds import install_crds
from metalmend.settings import CONTROLLER_NAMES
from metalmend_lab import assets, bmostandin, capi, hosts, openshift, provisioner, siteetcd
from metalmend_lab import policies as lab_policies
from metalmend_lab import servedeploy as lab_serve
from metalmend_lab.assets import CapiAssets, OpenShiftAssets
from metalmend_lab.controlplane import (
    LOOPBACK,
    Component,
    ControlPlane,
    ControlPlaneConfig,
    free_port,
    start_component,
    tls_context,
)
from metalmend_lab.drives import DEFAULT_ERASE_SECONDS
from metalmend_lab.inventory import HardwareConfig, status_path
from metalmend_lab.pki import KeyPair


class LabError(RuntimeError):
    """Something the user can fix; the message says what."""


def default_lab_dir() -> Path:
    return Path(os.environ.get("METALMEND_LAB_DIR", ".lab"))


@dataclass
class LabState:
    """What ``.lab/lab.json`` records about a running lab."""

    supervisor_pid: int
    ready: bool = False
    server: str = ""
    kubeconfig: str = ""
    components: dict[str, int] = field(default_factory=dict)
    started_in_seconds: float = 0.0
    error: str = ""
    restarts: dict[str, int] = field(default_factory=dict)  # component -> times restarted
    design_ref: str = ""  # the site design's URL (its EtcdClusters document), with >= 3 hosts
    controllers: str = ""  # what `metalmend run` runs (--controllers), "" none
    machine_api: str = "none"  # whose Machines (LabOptions.machine_api)

    @classmethod
    def read(cls, lab_dir: Path) -> LabState | None:
        try:
            data: dict[str, Any] = json.loads((lab_dir / "lab.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(**data)

    def write(self, lab_dir: Path) -> None:
        lab_dir.mkdir(parents=True, exist_ok=True)
        tmp = lab_dir / "lab.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(lab_dir / "lab.json")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child of ours still answers kill(0); it is not running.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    return True


def running_state(lab_dir: Path) -> LabState | None:
    state = LabState.read(lab_dir)
    if state is not None and alive(state.supervisor_pid):
        return state
    return None


# Every controller `metalmend run` has (metalmend.settings.CONTROLLER_NAMES): a
# NodeHealthCheck or a FenceRemediation made in the lab is acted on.
DEFAULT_CONTROLLERS = ",".join(CONTROLLER_NAMES)
# Beside baremetal-operator (--power-owner bmo-stand-in): nothing that sends power commands
# or fences on host-power's evidence (runner.OWN_POWER_ONLY).
BMO_CONTROLLERS = ",".join(
    c for c in CONTROLLER_NAMES if c not in ("host-power", "machine-remediation")
)
POWER_OWNERS = ("metalmend", bmostandin.COMPONENT)
# Whose Machines the lab makes (lab.hosts.register): "none" metalmend's own subset of
# Cluster API's CRDs (metalmend's MachineHealthCheck judges them); "capi" Cluster API's, its
# manager running (lab.capi); "capi-metal3" the same with Metal3Machines as CAPM3 makes
# them; "openshift" OpenShift's, its machine-healthcheck and nodelink-controller running
# (lab.openshift).
MACHINE_APIS = hosts.MACHINE_APIS
# Where the pinned upstream CRDs are (the directory holding metal3/): the lab's capi-metal3
# mode reads upstream's Metal3Machine CRD from there; metalmend does not ship it.
UPSTREAM_CRDS_ENV = "METALMEND_UPSTREAM_CRDS"


def default_controllers(machine_api: str, power_owner: str, nodelink: bool = True) -> str:
    """What `lab up` runs unless told: every controller but those another component of the
    lab does itself. Beside baremetal-operator: not host-power and machine-remediation.
    Under Cluster API: not machine-health-check (Cluster API's own acts on every
    MachineHealthCheck: two would remediate twice) and not node-link (Cluster API's Machine
    controller sets nodeRef). Under OpenShift: not node-link where its nodelink-controller
    runs."""
    skip: set[str] = set()
    if power_owner == bmostandin.COMPONENT:
        skip |= {"host-power", "machine-remediation"}
    if machine_api in ("capi", "capi-metal3"):
        skip |= {"machine-health-check", "node-link"}
    if machine_api == "openshift" and nodelink:
        skip.add("node-link")
    return ",".join(c for c in CONTROLLER_NAMES if c not in skip)


BMH_CRD = "metal3.io_baremetalhosts.yaml"
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class LabOptions:
    lab_dir: Path
    node_monitor_grace_period: float = 20.0
    hosts: int = 0
    bmc: str = "mixed"  # redfish, ipmi or mixed
    boot_delay: float = 3.0  # seconds from power-on until the kubelet registers
    power_delay: float = 0.0  # seconds before an IPMI power change lands
    # seconds before a Redfish power change lands (None: sushy-tools' random 1-11 s)
    redfish_power_delay: float | None = None
    erase_seconds: float = DEFAULT_ERASE_SECONDS  # a drive's secure erase (lab.drives)
    controllers: str | None = None  # `metalmend run` ("" none; None: default_controllers)
    soft_power_off_timeout: float = 30.0
    provision_delay: float = provisioner.DEFAULT_DELAY  # seconds an image takes to write
    apiserver_args: tuple[str, ...] = ()  # extra kube-apiserver flags (a benchmark's audit log)
    serve: bool = True  # `metalmend serve` and .lab/endpoints.json (servedeploy)
    # Cluster API's own manager and CRDs (lab.capi; assets.capi_manager()): its Machines
    # and MachineHealthChecks instead of metalmend's subset
    cluster_api: CapiAssets | None = None
    # Who owns the hosts' power: metalmend's host-power, or the lab's stand-in for
    # baremetal-operator (lab.bmostandin) with upstream's BareMetalHost CRD.
    power_owner: str = "metalmend"
    bmo_refresh: float = bmostandin.DEFAULT_REFRESH  # the stand-in's power refresh period
    machine_api: str = "none"  # MACHINE_APIS; "none" with cluster_api set means "capi"
    openshift: OpenShiftAssets | None = None  # None: found (assets.openshift_assets) if needed

    @property
    def beside_bmo(self) -> bool:
        return self.power_owner == bmostandin.COMPONENT

    @property
    def machines(self) -> str:
        """The machine API in effect (``machine_api``, or "capi" given ``cluster_api``)."""
        if self.machine_api == "none" and self.cluster_api is not None:
            return "capi"
        return self.machine_api


RESTART_FIRST_WAIT = 1.0  # seconds before the first restart after a crash
RESTART_MAX_WAIT = 30.0  # the wait doubles per crash up to this (kubelet: 10 s to 5 min)
RESTART_HEALTHY_RUN = 60.0  # a run this long resets the wait (kubelet: 10 min)


@dataclass
class Restarts:
    """Restart bookkeeping of one supervised component."""

    count: int = 0
    crashes: int = 0  # in a row: runs shorter than RESTART_HEALTHY_RUN
    started: float = field(default_factory=time.monotonic)
    due: float | None = None  # monotonic time of the pending restart, if one is pending

    def wait(self) -> float:
        return min(RESTART_FIRST_WAIT * (1 << min(self.crashes, 16)), RESTART_MAX_WAIT)


def _exit(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-code).name}"
    return f"exit code {code}"


@dataclass
class RunningLab:
    """A started lab, as the process that owns it sees it."""

    state: LabState
    plane: ControlPlane
    kubeconfig: Path
    hardware: HardwareConfig | None = None
    extras: dict[str, Component] = field(default_factory=dict)
    restarting: dict[str, Restarts] = field(default_factory=dict)  # restarted when they die
    endpoints: lab_serve.Endpoints | None = None  # what .lab/endpoints.json says
    say: Callable[[str], None] = field(default=lambda line: print(f"lab: {line}", flush=True))

    def client(self) -> Client:
        return Client(KubeConfig.from_file(self.kubeconfig))

    def check(self) -> None:
        """Restart a supervised component that died (after its wait); raise LabError when
        any other component has died."""
        components = {**self.plane.components, **self.extras}
        dead = [n for n, c in components.items() if not c.running()]
        if fatal := [n for n in dead if n not in self.restarting]:
            raise LabError(f"{', '.join(fatal)} stopped unexpectedly; see {self.plane.workdir}")
        for name in dead:
            self._restart(name, components[name], time.monotonic())

    def _restart(self, name: str, component: Component, now: float) -> None:
        restarts = self.restarting[name]
        if restarts.due is None:  # just found dead: schedule the restart
            ran = now - restarts.started
            if ran >= RESTART_HEALTHY_RUN:
                restarts.crashes = 0
            wait = restarts.wait()
            restarts.crashes += 1
            restarts.due = now + wait
            self.say(
                f"{name} (pid {component.pid}) ended with {_exit(component.exit_code)} after"
                f" {ran:.0f}s; restarting it in {wait:g}s (log: {component.log_path})"
            )
            return
        if now < restarts.due:
            return
        component.restart()
        restarts.due, restarts.started = None, now
        restarts.count += 1
        self.state.components[name] = component.pid or 0
        self.state.restarts[name] = restarts.count
        self.state.write(self.plane.workdir.parent)
        self.say(f"{name} restarted (pid {component.pid}, restart {restarts.count})")


@contextlib.contextmanager
def started(options: LabOptions) -> Iterator[RunningLab]:
    """Start the lab from an empty cluster; stop everything it started on exit."""
    lab_dir = options.lab_dir
    if (state := running_state(lab_dir)) is not None:
        raise LabError(
            f"a lab is already running in {lab_dir} (pid {state.supervisor_pid});"
            " run 'metalmend lab down' first"
        )
    # What the machine API needs, found before anything starts (a missing build or CRD is
    # one line, not a minute of start-up first)
    machines = options.machines
    if machines not in MACHINE_APIS:
        raise LabError(f"machine API {machines!r}: one of {', '.join(MACHINE_APIS)}")
    cluster_api, openshift_found, m3m_crd = None, None, None
    if machines in ("capi", "capi-metal3"):
        cluster_api = options.cluster_api or assets.capi_manager()
    if machines == "capi-metal3":
        m3m_crd = metal3machine_crd()
    if machines == "openshift":
        openshift_found = options.openshift or assets.openshift_assets()
    state = LabState(supervisor_pid=os.getpid(), machine_api=machines)
    state.write(lab_dir)
    config = ControlPlaneConfig(
        workdir=lab_dir / "controlplane",
        node_monitor_grace_period=options.node_monitor_grace_period,
        apiserver_args=options.apiserver_args,
    )
    plane: ControlPlane | None = None
    running: RunningLab | None = None
    try:
        ControlPlane(config).wipe()  # every lab starts from an empty cluster
        shutil.rmtree(lab_dir / "hardware", ignore_errors=True)
        shutil.rmtree(lab_dir / "drives", ignore_errors=True)  # new hosts, new drives
        # serve's database too: a new cluster's serve must not show the old lab's actions,
        # design revisions and tags (they name hosts and Nodes of a cluster that is gone)
        for suffix in ("", "-wal", "-shm", "-journal"):
            (lab_dir / f"serve.sqlite{suffix}").unlink(missing_ok=True)
        plane = ControlPlane(config)
        plane.start()
        state.components = plane.pids()
        state.write(lab_dir)  # pids recorded before anything else can fail
        kubeconfig = lab_dir / "kubeconfig"
        kubeconfig.write_bytes(plane.kubeconfig.read_bytes())
        kubeconfig.chmod(0o600)
        running = RunningLab(state, plane, kubeconfig)
        install_crds(running.client(), crd_dir(options))
        nodelink = True
        if cluster_api is not None:
            start_cluster_api(running, cluster_api)
        if m3m_crd is not None:
            capi.install_metal3machine_crd(running.client(), m3m_crd)
        if openshift_found is not None:
            nodelink = start_openshift(running, openshift_found)
        lab_policies.install(running.client())  # as the chart does (lab/policies.py)
        if options.hosts:
            start_hosts(running, options)
            if options.beside_bmo:
                start_bmo_stand_in(running, options.bmo_refresh)
        controllers = options.controllers
        if controllers is None:
            controllers = default_controllers(machines, options.power_owner, nodelink)
        state.controllers = controllers
        if controllers:
            start_controllers(running, controllers, options.soft_power_off_timeout)
        if options.serve:
            start_serve(running)
        state.ready, state.server = True, plane.server
        state.kubeconfig = str(kubeconfig.resolve())
        state.started_in_seconds = round(plane.started_in or 0.0, 2)
        state.write(lab_dir)
        yield running
    finally:
        if running is not None:
            for component in reversed(list(running.extras.values())):
                component.stop()
        if plane is not None:
            plane.stop()
        lab_serve.remove_endpoints(lab_dir)
        (lab_dir / "lab.json").unlink(missing_ok=True)


def upstream_crds() -> Path:
    """The directory of upstream baremetal-operator's CRDs, made by tools/metal3/crds.sh
    (``make metal3``) and cached; never made here."""
    made = subprocess.run(
        ["bash", str(REPO_ROOT / "tools" / "metal3" / "crds.sh"), "--cached"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if made.returncode != 0 or not made.stdout.strip():
        raise LabError(
            "the lab beside baremetal-operator needs upstream's BareMetalHost CRD:"
            f" {made.stderr.strip() or 'tools/metal3/crds.sh printed nothing'}"
        )
    return Path(made.stdout.strip().splitlines()[-1])


def crd_dir(options: LabOptions) -> Path:
    """metalmend's CRDs; beside the BMO stand-in, upstream's BareMetalHost CRD instead of
    ours (what a cluster running baremetal-operator serves: `metalmend run` tells the power
    owner from it), with ours for every other kind."""
    if not options.beside_bmo:
        return CRD_DIR
    crds = options.lab_dir / "crds"
    shutil.rmtree(crds, ignore_errors=True)
    crds.mkdir(parents=True)
    for path in CRD_DIR.glob("*.yaml"):
        if path.name != BMH_CRD:
            shutil.copy(path, crds)
    shutil.copy(upstream_crds() / BMH_CRD, crds)
    return crds


def start_bmo_stand_in(running: RunningLab, refresh: float) -> None:
    """The lab's stand-in for baremetal-operator (lab.bmostandin): it owns the hosts'
    power; restarted when it dies, as `metalmend run` is."""
    lab_dir = running.plane.workdir.parent
    status = bmostandin.status_path(lab_dir)
    status.unlink(missing_ok=True)
    config_file = lab_dir / "hardware" / "config.json"
    argv = bmostandin.argv(config_file, running.kubeconfig, refresh)
    _record(
        running,
        start_component(
            bmostandin.COMPONENT, argv, lab_dir, status.exists,
            waiting_for=f"its hosts' loops to start ({status} written)",
        ),
    )  # fmt: skip
    running.restarting[bmostandin.COMPONENT] = Restarts()


def _record(running: RunningLab, component: Component) -> None:
    running.extras[component.name] = component
    running.state.components[component.name] = component.pid or 0
    running.state.write(running.plane.workdir.parent)


def start_cluster_api(running: RunningLab, found: CapiAssets) -> None:
    """Cluster API's CRDs over metalmend's subset, then its manager (lab.capi), restarted
    when it dies as `metalmend run` is."""
    manager = capi.Manager(running.plane, found, running.kubeconfig)
    capi.install_crds(running.client(), manager)
    _record(running, manager.start())
    running.restarting[capi.COMPONENT] = Restarts()


def metal3machine_crd() -> Path:
    """Upstream's Metal3Machine CRD (cluster-api-provider-metal3 ``config/crd/bases/``),
    from the directory of pinned upstream CRDs ``METALMEND_UPSTREAM_CRDS`` names (its
    ``metal3/``): CAPM3's module cannot be fetched through the Go module proxy, so nothing
    here can generate it, and metalmend does not ship another project's CRD."""
    base = os.environ.get(UPSTREAM_CRDS_ENV)
    if not base:
        raise LabError(
            f"--machine-api capi-metal3 needs upstream's Metal3Machine CRD: set {UPSTREAM_CRDS_ENV}"
            f" to a directory holding metal3/{capi.METAL3MACHINE_CRD} (cluster-api-provider-metal3"
            " config/crd/bases/)"
        )
    found = Path(base) / "metal3" / capi.METAL3MACHINE_CRD
    if not found.is_file():
        raise LabError(f"no Metal3Machine CRD at {found} ({UPSTREAM_CRDS_ENV}={base})")
    return found


def start_openshift(running: RunningLab, found: OpenShiftAssets) -> bool:
    """OpenShift's machine-api CRDs, its machine-healthcheck and, where it built, its
    nodelink-controller (lab.openshift), each restarted when it dies as `metalmend run` is.
    Whether the nodelink-controller runs (else metalmend's node-link sets nodeRef)."""
    openshift.install_crds(running.client(), found)
    workdir = running.plane.workdir.parent / "openshift"
    check = openshift.HealthCheck(found, running.kubeconfig, workdir)
    _record(running, check.start())
    running.restarting[openshift.COMPONENT] = Restarts()
    if found.nodelink_controller is None:
        running.say("OpenShift's nodelink-controller is not built: metalmend's node-link runs")
        return False
    nodelink = openshift.NodeLink(found.nodelink_controller, running.kubeconfig, workdir)
    _record(running, nodelink.start())
    running.restarting[openshift.NODELINK] = Restarts()
    return True


def start_hosts(running: RunningLab, options: LabOptions) -> None:
    """The emulator (if any host speaks Redfish), the hardware process, the objects."""
    workdir = options.lab_dir / "hardware"
    workdir.mkdir(parents=True, exist_ok=True)
    emulator_port = free_port()
    config = hosts.plan(
        options.hosts, options.bmc, options.lab_dir, running.plane,
        emulator_port=emulator_port, boot_delay=options.boot_delay,
        power_delay=options.power_delay, erase_seconds=options.erase_seconds,
    )  # fmt: skip
    running.hardware = config
    context = tls_context(running.plane.ca.pair.cert, running.plane.admin)
    if any(h.bmc == "redfish" for h in config.hosts):
        conf = hosts.emulator_files(
            config, workdir / "redfish", running.plane, emulator_port,
            power_delay=options.redfish_power_delay,
        )  # fmt: skip

        def emulator_ready() -> bool:
            try:
                return httpx.get(
                    f"https://127.0.0.1:{emulator_port}/redfish/v1/", verify=context, timeout=5
                ).status_code in (200, 401)
            except httpx.HTTPError:
                return False

        _record(
            running,
            start_component(
                "redfish-emulator", hosts.emulator_argv(conf), workdir, emulator_ready,
                waiting_for=f"GET https://127.0.0.1:{emulator_port}/redfish/v1/ to answer",
            ),
        )  # fmt: skip
    site = siteetcd.plan(options.lab_dir, config.hosts, running.plane.binaries.etcd)
    machines = options.machines
    if machines == "capi-metal3":  # the Nodes' providerID names the Metal3Machine (CAPM3's)
        for spec in config.hosts:
            spec.provider_id = capi.metal3_provider_id(spec, spec.name)
    access = None
    if machines in ("capi", "capi-metal3"):
        access = capi.ClusterAccess(running.kubeconfig.read_bytes(), running.plane.server)
    if machines == "openshift":  # the providerIDs carry the hosts' uids: hosts first
        hosts.register(running.client(), config, None, machines)
    config_file = workdir / "config.json"
    config.write(config_file)
    _record(
        running,
        start_component(
            "hardware", hosts.hardware_argv(config_file), workdir,
            lambda: status_path(options.lab_dir).exists(),
            waiting_for=f"the hosts' BMCs up and {status_path(options.lab_dir)} written",
        ),
    )  # fmt: skip
    if machines != "openshift":
        hosts.register(running.client(), config, access, machines)
    start_provisioner(running, config_file, options.provision_delay)
    if site is not None:  # the site etcd (on the hosts) and the design declaring it
        siteetcd.wait_healthy(site)
        ca = running.plane.ca
        serving = ca.issue("design-server", "design-server", ip_addresses=(LOOPBACK,), server=True)
        argv = siteetcd.design_server_argv(options.lab_dir, site, serving)
        ready = lambda: siteetcd.design_served(site, ca.pair.cert)  # noqa: E731
        _record(
            running,
            start_component(
                "design-server", argv, workdir, ready,
                waiting_for=f"the site design to be served at {site.design_url}",
            ),
        )  # fmt: skip
        running.state.design_ref = site.design_url


def start_provisioner(running: RunningLab, config_file: Path, delay: float) -> None:
    """The lab's stand-in for baremetal-operator's provisioning (lab.provisioner),
    restarted when it dies as `metalmend run` is."""
    lab_dir = running.plane.workdir.parent
    status = provisioner.status_path(lab_dir)
    status.unlink(missing_ok=True)  # ready once it has looked at the hosts
    argv = provisioner.argv(config_file, running.kubeconfig, delay)
    _record(
        running,
        start_component(
            provisioner.COMPONENT, argv, lab_dir, status.exists,
            waiting_for=f"its first look at the hosts ({status} written)",
        ),
    )  # fmt: skip
    running.restarting[provisioner.COMPONENT] = Restarts()


def controller_argv(
    kubeconfig: Path, ca: Path, controllers: str, port: int, soft: float
) -> list[str]:
    """`metalmend run` against the lab: its BMCs' certificates come from the lab CA."""
    return [
        sys.executable, "-m", "metalmend", "run", "--kubeconfig", str(kubeconfig),
        "--controllers", controllers, "--health-bind", f"127.0.0.1:{port}",
        "--bmc-ca-bundle", str(ca), "--soft-power-off-timeout", f"{soft:g}",
        "--power-poll-interval", "5", "--bmc-timeout", "5",
        "--remediation-retry-base", "5",  # lab timeouts are seconds, not minutes
    ]  # fmt: skip


def start_controllers(running: RunningLab, controllers: str, soft_timeout: float) -> None:
    """metalmend itself, as an operator would run it against this cluster."""
    ca = running.plane.ca.pair.cert
    port = 0

    def argv() -> list[str]:  # a fresh port for each try (start_component)
        nonlocal port
        port = free_port()
        return controller_argv(running.kubeconfig, ca, controllers, port, soft_timeout)

    def ready() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    _record(
        running,
        start_component(
            "metalmend", argv, running.plane.workdir.parent, ready,
            waiting_for="metalmend run's GET /readyz to answer 200 (its --health-bind)",
        ),
    )  # fmt: skip
    running.restarting["metalmend"] = Restarts()


def start_serve(running: RunningLab) -> None:
    """`metalmend serve`, restarted when it dies as `metalmend run` is, and
    .lab/endpoints.json saying how to call it (servedeploy)."""
    lab_dir = running.plane.workdir.parent
    component, endpoints = lab_serve.start(running.plane, running.client(), lab_dir)
    _record(running, component)
    running.restarting[lab_serve.COMPONENT] = Restarts()
    # The design URL exists with the site etcd (start_hosts, >= 3 hosts): else left out.
    endpoints = dataclasses.replace(endpoints, design_ref=running.state.design_ref or None)
    running.endpoints = endpoints
    endpoints.write(lab_dir)


@contextlib.contextmanager
def stop_requested() -> Iterator[threading.Event]:
    """An Event set by SIGINT or SIGTERM while the block runs."""
    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def up(options: LabOptions, on_ready: Callable[[LabState], None]) -> None:
    """Start the lab and serve until SIGINT/SIGTERM, then stop everything it started."""
    with stop_requested() as stop, started(options) as running:
        on_ready(running.state)
        while not stop.wait(0.5):
            running.check()


def up_detached(options: LabOptions, timeout: float = 600.0) -> LabState:
    """Start ``metalmend lab up`` in the background and return once it is ready."""
    lab_dir = options.lab_dir
    if (state := running_state(lab_dir)) is not None:
        raise LabError(
            f"a lab is already running in {lab_dir} (pid {state.supervisor_pid});"
            " run 'metalmend lab down' first"
        )
    lab_dir.mkdir(parents=True, exist_ok=True)
    (lab_dir / "lab.json").unlink(missing_ok=True)
    log_path = lab_dir / "lab.log"
    argv = [sys.executable, "-m", "metalmend", "lab", "up", "--dir", str(lab_dir)]
    argv += ["--node-grace", f"{options.node_monitor_grace_period:g}"]
    argv += ["--hosts", str(options.hosts), "--bmc", options.bmc]
    argv += ["--boot-delay", f"{options.boot_delay:g}"]
    if options.controllers is not None:
        argv += ["--controllers", options.controllers]
    argv += ["--machine-api", options.machines]
    argv += ["--erase-seconds", f"{options.erase_seconds:g}"]
    argv += ["--provision-delay", f"{options.provision_delay:g}"]
    argv += ["--power-owner", options.power_owner, "--bmo-refresh", f"{options.bmo_refresh:g}"]
    with log_path.open("wb") as log:
        child = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = LabState.read(lab_dir)
        if state is not None and state.ready:
            return state
        if child.poll() is not None:
            tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-10:])
            raise LabError(f"the lab did not start (log: {log_path}):\n{tail}")
        time.sleep(0.2)
    child.terminate()
    raise LabError(f"the lab was not ready after {timeout:.0f}s (log: {log_path})")


def down(lab_dir: Path, timeout: float = 30.0) -> bool:
    """Stop a running lab; return False when none was running. Leaves no process behind."""
    state = LabState.read(lab_dir)
    if state is None:
        return False
    pids = [state.supervisor_pid, *state.components.values()]
    with contextlib.suppress(ProcessLookupError):
        os.kill(state.supervisor_pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:  # a supervisor killed with SIGKILL cannot stop its children itself
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    lab_serve.remove_endpoints(lab_dir)
    (lab_dir / "lab.json").unlink(missing_ok=True)
    return True


@dataclass
class ComponentStatus:
    name: str
    pid: int
    running: bool
    restarts: int = 0


@dataclass
class HostStatus:
    name: str
    bmc: str
    power: str
    kubelet: str
    bmc_line: str
    bmc_reachable: bool
    node: bool = False
    ready: str = "-"
    pods: int = 0  # pods its kubelet runs


@dataclass
class LabStatus:
    running: bool
    ready: bool = False
    server: str = ""
    kubeconfig: str = ""
    apiserver_ready: bool = False
    components: list[ComponentStatus] = field(default_factory=list)
    controllers: list[str] = field(default_factory=list)  # what `metalmend run` runs
    machine_api: str = "none"
    hosts: list[HostStatus] = field(default_factory=list)
    site_etcd: siteetcd.SiteStatus | None = None


def status(lab_dir: Path) -> LabStatus:
    state = running_state(lab_dir)
    if state is None:
        return LabStatus(running=False)
    report = LabStatus(
        running=True,
        ready=state.ready,
        server=state.server,
        kubeconfig=state.kubeconfig,
        components=[
            ComponentStatus(n, p, alive(p), state.restarts.get(n, 0))
            for n, p in state.components.items()
        ],
        controllers=[c for c in state.controllers.split(",") if c],
        machine_api=state.machine_api,
    )
    if state.ready:
        report.apiserver_ready = _apiserver_ready(lab_dir)
        report.hosts = _host_status(lab_dir, report.apiserver_ready)
        with contextlib.suppress(OSError, ValueError):
            hardware = json.loads(status_path(lab_dir).read_text())
            report.site_etcd = siteetcd.status(lab_dir, hardware)
    return report


def _host_status(lab_dir: Path, cluster_up: bool) -> list[HostStatus]:
    try:
        hardware: dict[str, dict[str, Any]] = json.loads(status_path(lab_dir).read_text())
    except (OSError, ValueError):
        return []
    nodes: dict[str, Any] = {}
    if cluster_up:
        with contextlib.suppress(Exception):
            client = Client(KubeConfig.from_file(lab_dir / "kubeconfig"))
            nodes = {str(n.metadata.name if n.metadata else ""): n for n in client.list(Node)}
    report = []
    for name, hw in hardware.items():
        node = nodes.get(name)
        conditions = (node.status.conditions if node and node.status else None) or []
        ready = next((c.status for c in conditions if c.type == "Ready"), "-")
        report.append(
            HostStatus(
                name, hw["bmc"], hw["power"], hw["kubelet"], hw["bmc_line"],
                bmc_reachable=_bmc_reachable(hw["address"]) if hw["bmc_line"] != "down" else False,
                node=node is not None, ready=ready, pods=int(hw.get("pods", 0)),
            )
        )  # fmt: skip
    return report


def _bmc_reachable(address: str) -> bool:
    """A BMC answers: Redfish serves its root, an IPMI BMC its presence ping."""
    from metalmend.bmc import parse
    from metalmend.bmc.ipmi import probe_blocking

    bmc = parse(address)
    if bmc.protocol == "redfish":
        try:
            httpx.get(f"{bmc.endpoint}/redfish/v1/", verify=False, timeout=2)
        except httpx.HTTPError:
            return False
        return True
    return probe_blocking(bmc.host, bmc.port or 623, 1.0) == "answers"


def site_design(lab_dir: Path) -> str:
    """The running lab's site design as YAML documents (lab.sitedesign): its hosts'
    BareMetalHosts, Machines and Nodes, and its EtcdClusters when it has a site etcd."""
    from metalmend.designs.documents import dump_all
    from metalmend_lab import sitedesign

    if running_state(lab_dir) is None:
        raise LabError(f"no lab is running in {lab_dir}")
    try:
        config = HardwareConfig.read(lab_dir / "hardware" / "config.json")
    except (OSError, ValueError, KeyError) as error:
        raise LabError(
            f"the lab in {lab_dir} has no hosts (start it with --hosts): {error}"
        ) from None
    site = siteetcd.SitePlan.read(siteetcd.plan_path(lab_dir))
    etcd = siteetcd.design_document(site) if site is not None else None
    return dump_all(sitedesign.site_documents(config.hosts, etcd))


FAULTS = ("hang", "recover", "bmc-down", "bmc-up", "bmc-slow", "ignore-soft", "honour-soft")


def inject_fault(lab_dir: Path, host: str, kind: str) -> None:
    """Record a fault for the hardware process to apply (within 0.2 s)."""
    from metalmend_lab.faults import Faults, faults_path, write_faults

    if kind not in FAULTS:
        raise ValueError(f"unknown fault {kind!r}; one of: {', '.join(FAULTS)}")
    if running_state(lab_dir) is None:
        raise ValueError(f"no lab is running in {lab_dir}")
    try:
        known = json.loads(status_path(lab_dir).read_text())
    except (OSError, ValueError):
        known = {}
    if host not in known:
        raise ValueError(f"no host {host!r} in this lab; hosts: {', '.join(known) or 'none'}")
    if kind in ("ignore-soft", "honour-soft") and known[host].get("bmc") != "ipmi":
        raise ValueError(f"{kind} is available on IPMI lab hosts only; {host} speaks Redfish")
    faults = Faults.read(faults_path(lab_dir, host))
    if kind in ("hang", "recover"):
        faults.hang = kind == "hang"
    elif kind in ("ignore-soft", "honour-soft"):
        faults.ignore_soft = kind == "ignore-soft"
    else:
        faults.bmc = kind.removeprefix("bmc-")
    write_faults(lab_dir, host, faults)
    _wait_applied(lab_dir, host, asdict(faults))


def _wait_applied(lab_dir: Path, host: str, faults: dict[str, Any], within: float = 5.0) -> None:
    """Return once the hardware process reports the fault in force (it polls every 0.2 s),
    so that what a caller does next meets the faulty hardware."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if json.loads(status_path(lab_dir).read_text())[host]["faults"] == faults:
                return
        time.sleep(0.05)
    raise LabError(f"the lab hardware did not apply the fault to {host} within {within:.0f}s")


def _apiserver_ready(lab_dir: Path) -> bool:
    pki = lab_dir / "controlplane" / "pki"
    state = LabState.read(lab_dir)
    if state is None:
        return False
    try:
        context = tls_context(pki / "ca.crt", KeyPair(pki / "admin.crt", pki / "admin.key"))
        response = httpx.get(f"{state.server}/readyz", verify=context, timeout=3.0)
    except (httpx.HTTPError, OSError):
        return False
    return response.text == "ok"
