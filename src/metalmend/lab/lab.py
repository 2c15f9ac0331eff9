"""The lab: a real control plane (and, later, hosts) kept under one directory, ``.lab/``.

``up`` runs in the foreground until Ctrl-C or SIGTERM; ``up --detach`` starts that same
foreground process in its own session and returns once it is ready. The running lab is
described by ``.lab/lab.json`` (supervisor and component pids, ports), which is how ``down``
and ``status`` find it, and which lets ``down`` clean up even after the supervisor was
killed with SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
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

from metalmend.kube.crds import install_crds
from metalmend.lab.controlplane import ControlPlane, ControlPlaneConfig, tls_context
from metalmend.lab.pki import KeyPair


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


@dataclass
class LabOptions:
    lab_dir: Path
    node_monitor_grace_period: float = 20.0


@dataclass
class RunningLab:
    """A started lab, as the process that owns it sees it."""

    state: LabState
    plane: ControlPlane
    kubeconfig: Path

    def client(self) -> Client:
        return Client(KubeConfig.from_file(self.kubeconfig))

    def check(self) -> None:
        """Raise LabError when a component has died."""
        if dead := [n for n, c in self.plane.components.items() if not c.running()]:
            raise LabError(f"{', '.join(dead)} stopped unexpectedly; see {self.plane.workdir}")


@contextlib.contextmanager
def started(options: LabOptions) -> Iterator[RunningLab]:
    """Start the lab from an empty cluster; stop everything it started on exit."""
    lab_dir = options.lab_dir
    if (state := running_state(lab_dir)) is not None:
        raise LabError(
            f"a lab is already running in {lab_dir} (pid {state.supervisor_pid});"
            " run 'metalmend lab down' first"
        )
    state = LabState(supervisor_pid=os.getpid())
    state.write(lab_dir)
    config = ControlPlaneConfig(
        workdir=lab_dir / "controlplane",
        node_monitor_grace_period=options.node_monitor_grace_period,
    )
    plane: ControlPlane | None = None
    try:
        ControlPlane(config).wipe()  # every lab starts from an empty cluster
        plane = ControlPlane(config)
        plane.start()
        state.components = plane.pids()
        state.write(lab_dir)  # pids recorded before anything else can fail
        kubeconfig = lab_dir / "kubeconfig"
        kubeconfig.write_bytes(plane.kubeconfig.read_bytes())
        kubeconfig.chmod(0o600)
        running = RunningLab(state, plane, kubeconfig)
        install_crds(running.client())
        state.ready, state.server = True, plane.server
        state.kubeconfig = str(kubeconfig.resolve())
        state.started_in_seconds = round(plane.started_in or 0.0, 2)
        state.write(lab_dir)
        yield running
    finally:
        if plane is not None:
            plane.stop()
        (lab_dir / "lab.json").unlink(missing_ok=True)


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
    (lab_dir / "lab.json").unlink(missing_ok=True)
    return True


@dataclass
class ComponentStatus:
    name: str
    pid: int
    running: bool


@dataclass
class LabStatus:
    running: bool
    ready: bool = False
    server: str = ""
    kubeconfig: str = ""
    apiserver_ready: bool = False
    components: list[ComponentStatus] = field(default_factory=list)


def status(lab_dir: Path) -> LabStatus:
    state = running_state(lab_dir)
    if state is None:
        return LabStatus(running=False)
    report = LabStatus(
        running=True,
        ready=state.ready,
        server=state.server,
        kubeconfig=state.kubeconfig,
        components=[ComponentStatus(n, p, alive(p)) for n, p in state.components.items()],
    )
    if state.ready:
        report.apiserver_ready = _apiserver_ready(lab_dir)
    return report


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
