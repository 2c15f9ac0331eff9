"""A real Kubernetes control plane on 127.0.0.1: etcd, kube-apiserver, kube-controller-manager
and (when its binary is there) kube-scheduler.

The same binaries and flags a real cluster runs, with free ports, a generated CA, serving
certificates, service-account signing keys and ``--authorization-mode=Node,RBAC``. The
controller-manager runs its default controllers (garbage collector, disruption, node
lifecycle, service accounts, ...), so tests see the cluster behaviour our controllers rely on;
the scheduler binds pods to Nodes, so workloads run on the lab's simulated kubelets.

Every child process is put in its own session (so a Ctrl-C at the terminal reaches only us,
and we stop them in order) and is told by the kernel to die with us (PR_SET_PDEATHSIG), so a
killed test run or lab never leaves a control plane behind.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import yaml

from metalmend_lab.assets import Binaries, find_binaries
from metalmend_lab.pki import CertificateAuthority, KeyPair, write_signing_key

log = logging.getLogger("metalmend_lab.controlplane")

LOOPBACK = "127.0.0.1"
ADMIN_USER = "metalmend-admin"
_PR_SET_PDEATHSIG = 1
# Start order; stop() goes the other way. kube-scheduler is optional (envtest's asset
# directories have none): without it pods are never bound to Nodes.
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


class ControlPlaneError(RuntimeError):
    """A component did not start; the message names it and points at its log."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, kept from the kernel's own picks.

    A port picked by binding port 0 and released could be taken before the server it is
    for binds it (by another process's pick, or as the local port of any outgoing
    connection: a busy machine makes thousands), which then fails with "address already in
    use". So the port comes from outside the kernel's ephemeral range
    (``/proc/sys/net/ipv4/ip_local_port_range``), which neither a bind to port 0 nor an
    outgoing connection ever uses, at random (another lab's picks rarely meet ours), and
    is left in TIME_WAIT (a connection to it accepted and closed from our side, as the
    ephemeral-port-reserve technique does): for the next 60 s a plain bind of it fails, so
    another lab's ``free_port`` passes it over, while a server binding it with
    SO_REUSEADDR gets it at once (Go's net.Listen, so etcd, the Kubernetes components,
    kwok, Prometheus and the Cluster API manager; Python's HTTPServer, asyncio's servers
    and uvicorn; PostgreSQL). What is left, a process binding the very number on purpose,
    is what ``start_component``'s retry on "address already in use" is for."""
    for port in _candidates():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
            try:
                listener.bind((LOOPBACK, port))  # plain: a port in TIME_WAIT is passed over
            except OSError:
                continue
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.listen(1)
            address = listener.getsockname()
            with socket.create_connection(address):
                accepted, _ = listener.accept()
                accepted.close()  # our side closes first: the port's end goes to TIME_WAIT
            found: int = address[1]
            return found
    raise OSError("no free TCP port on 127.0.0.1")


def free_udp_port() -> int:
    """A UDP port on 127.0.0.1 that nothing is bound to, from outside the kernel's
    ephemeral range, at random (see ``free_port``; UDP has no TIME_WAIT to hold it)."""
    for port in _candidates():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind((LOOPBACK, port))
            except OSError:
                continue
            found: int = sock.getsockname()[1]
            return found
    raise OSError("no free UDP port on 127.0.0.1")


# Ports picked outside the ephemeral range start here (below: well-known services).
LOWEST_PICKED = 10000


def _candidates(tries: int = 200) -> Iterator[int]:
    """Random ports outside the kernel's ephemeral range, then 0 (the kernel's pick) as a
    last resort."""
    low, high = _ephemeral_range()
    below, above = range(LOWEST_PICKED, low), range(high + 1, 65536)
    outside = below if len(below) >= len(above) else above
    if len(outside) >= 1000:
        for _ in range(tries):
            yield secrets.choice(outside)
    yield 0


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def _die_with_parent() -> None:
    # Runs in the child between fork and exec.
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    # SIGKILL, not SIGTERM: this is the emergency path (we were killed), and etcd and
    # kube-apiserver terminating gracefully at the same moment wait on each other.
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# The kernel sends the death signal when the *thread* that forked the child exits, not the
# process. Children are therefore always started from this one thread, which lives as long
# as the process, whichever thread (an asyncio worker, a test) asks for a start.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="metalmend-spawner")


@dataclass
class Component:
    """One running upstream binary, its command line and its log."""

    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    def start(self) -> None:
        self._log = self.log_path.open("ab")
        self.process = _SPAWNER.submit(
            subprocess.Popen,
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent,
        ).result()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def exit_code(self) -> int | None:
        """How the process ended (negative: the signal that killed it); None while it runs."""
        return self.process.poll() if self.process is not None else None

    def restart(self) -> None:
        """Start again after the process ended; the same log continues."""
        self.stop()
        self.start()

    def stop(self, timeout: float = 3.0) -> None:
        # kube-apiserver's graceful shutdown waits for open HTTP/2 streams (watches) to go
        # idle, which can take a minute; a lab does not need that, so the grace is short.
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# Seconds a lab component may take to be ready: a cold start on a busy 2-core machine
# (Python's imports, a database's migrations, a control plane beside another) takes tens
# of seconds. Generous on purpose: a healthy start ends the wait at once, and one that
# exits is reported at once with its log.
START_TIMEOUT = 180.0


# A component that says this and exits during start-up lost a port it was given to another
# process (``free_port``); ``start_component`` starts it again on fresh ports.
PORT_TAKEN = "address already in use"
PORT_TRIES = 3


def start_component(
    name: str,
    argv: list[str] | Callable[[], list[str]],
    workdir: Path,
    ready: Callable[[], bool],
    timeout: float = START_TIMEOUT,
    waiting_for: str = "it to be ready",
) -> Component:
    """Start ``argv`` (log in ``workdir/name.log``) and return once ``ready()`` is true
    (``waiting_for`` says what that means, for the failure's message).

    ``argv`` may be a function that picks the component's ports (``free_port``) and
    returns its command line: when the process exits during start-up saying a port was
    taken ("address already in use"), it is called again for fresh ports and the
    component started again (up to ``PORT_TRIES`` times, each said in the log), so
    ``ready`` must read the ports where ``argv`` leaves them."""
    make = argv if callable(argv) else lambda: argv
    log_path = workdir / f"{name}.log"
    for attempt in range(1, PORT_TRIES + 1):
        begun_at = log_path.stat().st_size if log_path.exists() else 0
        component = Component(name, make(), log_path)
        component.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not component.running():
                break
            if ready():
                return component
            time.sleep(0.1)
        else:
            component.stop()
            raise ControlPlaneError(
                f"{name} not ready after {timeout:.0f}s: waited for {waiting_for}"
                f" (log: {component.log_path})"
            )
        component.stop()  # closes its log
        said = _read_from(log_path, begun_at)
        if callable(argv) and PORT_TAKEN in said.lower() and attempt < PORT_TRIES:
            taken = next(line for line in said.splitlines() if PORT_TAKEN in line.lower())
            log.warning(
                "%s: a port it was given was taken by another process before it bound it"
                " (%s); starting it again on fresh ports (try %d of %d)",
                name, taken.strip(), attempt + 1, PORT_TRIES,
            )  # fmt: skip
            continue
        raise ControlPlaneError(
            f"{name} exited during start-up (log: {component.log_path}):\n{component.log_tail()}"
        )
    raise AssertionError("unreachable")  # pragma: no cover


def _read_from(path: Path, offset: int) -> str:
    try:
        with path.open("rb") as log_file:
            log_file.seek(offset)
            return log_file.read().decode(errors="replace")
    except OSError:
        return ""


@dataclass
class ControlPlaneConfig:
    """What a test or the lab may tune. Durations are in seconds."""

    workdir: Path
    # kube-controller-manager marks a Node Unknown after this long without heartbeats.
    # Upstream's default is 50 s; the lab uses less so demos and tests do not wait.
    node_monitor_grace_period: float = 20.0
    node_monitor_period: float = 2.0
    etcd_args: Sequence[str] = ()
    apiserver_args: Sequence[str] = ()
    controller_manager_args: Sequence[str] = ()
    scheduler_args: Sequence[str] = ()
    start_timeout: float = START_TIMEOUT
    binaries: Binaries | None = None


@dataclass
class Ports:
    etcd_client: int = field(default_factory=free_port)
    etcd_peer: int = field(default_factory=free_port)
    apiserver: int = field(default_factory=free_port)
    controller_manager: int = field(default_factory=free_port)
    scheduler: int = field(default_factory=free_port)


# Which of ``Ports`` each component listens on.
PORTS_OF = {
    "etcd": ("etcd_client", "etcd_peer"),
    "kube-apiserver": ("apiserver",),
    "kube-controller-manager": ("controller_manager",),
    "kube-scheduler": ("scheduler",),
}


class ControlPlane:
    """Start, stop and restart the control plane; mint credentials for any identity."""

    def __init__(self, config: ControlPlaneConfig) -> None:
        self.config = config
        self.workdir = config.workdir
        self.pki_dir = self.workdir / "pki"
        self.ports = Ports()
        self.binaries = config.binaries or find_binaries()
        self.ca = CertificateAuthority(self.pki_dir)
        self.signing_key = write_signing_key(self.pki_dir)
        self.admin = self.ca.issue("admin", ADMIN_USER, organizations=("system:masters",))
        self.kubeconfig = self.workdir / "kubeconfig"
        self.components: dict[str, Component] = {}
        self.started_in: float | None = None
        # Seconds from start() until each component answered ready, for benchmarks.
        self.ready_after: dict[str, float] = {}

    # ---- addresses -------------------------------------------------------------------------

    @property
    def server(self) -> str:
        return f"https://{LOOPBACK}:{self.ports.apiserver}"

    @property
    def etcd_url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.etcd_client}"

    def pids(self) -> dict[str, int]:
        return {name: c.pid for name, c in self.components.items() if c.pid and c.running()}

    # ---- life cycle ------------------------------------------------------------------------

    def start(self) -> None:
        """Start everything and return once /readyz is ok and default controllers work."""
        began = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._write_kubeconfig(self.kubeconfig, self.admin)
        steps: list[tuple[str, Callable[[], list[str]], Callable[[], bool]]] = [
            ("etcd", self._etcd_argv, self._etcd_ready),
            ("kube-apiserver", self._apiserver_argv, self._apiserver_ready),
            ("kube-controller-manager", self._controller_manager_argv, self._controllers_ready),
        ]
        if self.binaries.kube_scheduler is not None:
            steps.append(("kube-scheduler", self._scheduler_argv, self._scheduler_ready))
        else:
            log.info("no kube-scheduler binary: pods will not be bound to Nodes")
        try:
            for name, argv, ready in steps:
                self._start(name, self._on_fresh_ports(name, argv), ready)
                self.ready_after[name] = time.monotonic() - began
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def stop(self) -> None:
        """Stop in reverse order of start; safe to call twice."""
        for name in reversed(COMPONENTS):
            if name in self.components:
                self.components[name].stop()

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port, with the same data."""
        self.components["kube-apiserver"].stop()
        self._start("kube-apiserver", self._apiserver_argv(), self._apiserver_ready)

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _on_fresh_ports(self, name: str, argv: Callable[[], list[str]]) -> Callable[[], list[str]]:
        """``argv`` for ``start_component``: the ports picked at construction first, fresh
        ones for each try after a port was taken (the kubeconfig rewritten with the
        apiserver's)."""
        tries = 0

        def make() -> list[str]:
            nonlocal tries
            tries += 1
            if tries > 1:
                for port in PORTS_OF[name]:
                    setattr(self.ports, port, free_port())
                if name == "kube-apiserver":
                    self._write_kubeconfig(self.kubeconfig, self.admin)
            return argv()

        return make

    def _start(
        self, name: str, argv: list[str] | Callable[[], list[str]], ready: Callable[[], bool]
    ) -> None:
        self.components[name] = start_component(
            name, argv, self.workdir, ready, self.config.start_timeout
        )

    # ---- command lines ---------------------------------------------------------------------

    def _etcd_argv(self) -> list[str]:
        client = self.etcd_url
        peer = f"http://{LOOPBACK}:{self.ports.etcd_peer}"
        return [
            str(self.binaries.etcd),
            "--name=lab",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=lab={peer}",
            "--unsafe-no-fsync",  # a lab cluster trades durability for speed
            "--log-level=warn",
            *self.config.etcd_args,
        ]

    def _apiserver_argv(self) -> list[str]:
        serving = self.ca.issue(
            "apiserver",
            "kube-apiserver",
            dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
            ip_addresses=(LOOPBACK,),
            server=True,
        )
        return [
            str(self.binaries.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--bind-address={LOOPBACK}",
            f"--advertise-address={LOOPBACK}",
            f"--secure-port={self.ports.apiserver}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            f"--client-ca-file={self.ca.pair.cert}",
            f"--service-account-issuer={self.server}",
            f"--service-account-key-file={self.signing_key.cert}",
            f"--service-account-signing-key-file={self.signing_key.key}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--endpoint-reconciler-type=none",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            *self.config.apiserver_args,
        ]

    def _controller_manager_argv(self) -> list[str]:
        identity = self.ca.issue("controller-manager", "system:kube-controller-manager")
        kubeconfig = self.workdir / "controller-manager.kubeconfig"
        self._write_kubeconfig(kubeconfig, identity)
        serving = self.ca.issue(
            "controller-manager-serving",
            "kube-controller-manager",
            dns_names=("localhost",),
            ip_addresses=(LOOPBACK,),
            server=True,
        )
        return [
            str(self.binaries.kube_controller_manager),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.ports.controller_manager}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            f"--service-account-private-key-file={self.signing_key.key}",
            f"--root-ca-file={self.ca.pair.cert}",
            f"--cluster-signing-cert-file={self.ca.pair.cert}",
            f"--cluster-signing-key-file={self.ca.pair.key}",
            "--cluster-name=metalmend-lab",
            f"--node-monitor-grace-period={self.config.node_monitor_grace_period:g}s",
            f"--node-monitor-period={self.config.node_monitor_period:g}s",
            *self.config.controller_manager_args,
        ]

    def _scheduler_argv(self) -> list[str]:
        assert self.binaries.kube_scheduler is not None
        identity = self.ca.issue("scheduler", "system:kube-scheduler")
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        self._write_kubeconfig(kubeconfig, identity)
        serving = self.ca.issue(
            "scheduler-serving",
            "kube-scheduler",
            dns_names=("localhost",),
            ip_addresses=(LOOPBACK,),
            server=True,
        )
        return [
            str(self.binaries.kube_scheduler),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--bind-address={LOOPBACK}",
            f"--secure-port={self.ports.scheduler}",
            f"--tls-cert-file={serving.cert}",
            f"--tls-private-key-file={serving.key}",
            "--leader-elect=false",
            *self.config.scheduler_args,
        ]

    # ---- readiness -------------------------------------------------------------------------

    def admin_http(self, timeout: float = 5.0) -> httpx.Client:
        """An HTTP client that speaks to the apiserver as the admin (for probes and tests)."""
        context = tls_context(self.ca.pair.cert, self.admin)
        return httpx.Client(base_url=self.server, verify=context, timeout=timeout)

    def _etcd_ready(self) -> bool:
        return _answers(f"{self.etcd_url}/health", lambda r: '"health":"true"' in r.text)

    def _apiserver_ready(self) -> bool:
        with contextlib.suppress(httpx.HTTPError), self.admin_http(2.0) as http:
            return http.get("/readyz").text == "ok"
        return False

    def _controllers_ready(self) -> bool:
        # The service-account controller creating "default" proves the controllers run.
        with contextlib.suppress(httpx.HTTPError), self.admin_http(2.0) as http:
            return http.get("/api/v1/namespaces/default/serviceaccounts/default").is_success
        return False

    def _scheduler_ready(self) -> bool:
        # /healthz is always allowed (--authorization-always-allow-paths); the lab CA must
        # vouch for the scheduler's serving certificate.
        context = ssl.create_default_context(cafile=str(self.ca.pair.cert))
        url = f"https://{LOOPBACK}:{self.ports.scheduler}/healthz"
        return _answers(url, lambda r: r.text == "ok", verify=context)

    # ---- credentials -----------------------------------------------------------------------

    def _write_kubeconfig(self, path: Path, identity: KeyPair | None, token: str = "") -> Path:
        user: dict[str, str] = {}
        if identity is not None:
            user["client-certificate-data"] = _b64(identity.cert.read_bytes())
            user["client-key-data"] = _b64(identity.key.read_bytes())
        if token:
            user["token"] = token
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "metalmend-lab",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": _b64(self.ca.pair.cert.read_bytes()),
                    },
                }
            ],
            "users": [{"name": "user", "user": user}],
            "contexts": [
                {"name": "metalmend-lab", "context": {"cluster": "metalmend-lab", "user": "user"}}
            ],
            "current-context": "metalmend-lab",
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """A kubeconfig that authenticates as ``user`` in ``groups`` (client certificate)."""
        stem = "user-" + "".join(c if c.isalnum() else "-" for c in user)
        identity = self.ca.issue(stem, user, organizations=tuple(groups))
        return self._write_kubeconfig(self.workdir / "users" / f"{stem}.kubeconfig", identity)

    def service_account_kubeconfig(
        self, namespace: str, name: str, expiration_seconds: int = 3600
    ) -> Path:
        """A kubeconfig holding a real token of ServiceAccount ``namespace/name`` (created
        when missing), issued by the TokenRequest API."""
        with self.admin_http() as http:
            accounts = f"/api/v1/namespaces/{namespace}/serviceaccounts"
            created = http.post(accounts, json={"metadata": {"name": name}})
            if created.status_code not in (201, 409):
                created.raise_for_status()
            response = http.post(
                f"{accounts}/{name}/token",
                json={"spec": {"expirationSeconds": expiration_seconds}},
            )
            response.raise_for_status()
            token: str = response.json()["status"]["token"]
        path = self.workdir / "users" / f"sa-{namespace}-{name}.kubeconfig"
        return self._write_kubeconfig(path, None, token=token)

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (what kube-apiserver does every
        five minutes); watches resuming from before it get 410 Gone. Returns the revision."""
        header = httpx.post(f"{self.etcd_url}/v3/kv/range", json={"key": "AA==", "limit": 1})
        revision = int(header.raise_for_status().json()["header"]["revision"])
        compacted = httpx.post(
            f"{self.etcd_url}/v3/kv/compaction", json={"revision": revision, "physical": True}
        )
        compacted.raise_for_status()
        return revision

    def kubeconfig_via(self, server: str, path: Path) -> Path:
        """An admin kubeconfig that reaches the apiserver at ``server`` (a proxy, say)."""
        config = yaml.safe_load(self.kubeconfig.read_text())
        config["clusters"][0]["cluster"]["server"] = server
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path

    def wipe(self) -> None:
        """Remove the work directory (after stop)."""
        shutil.rmtree(self.workdir, ignore_errors=True)


def tls_context(ca: Path, identity: KeyPair) -> ssl.SSLContext:
    """TLS that trusts only the lab CA and presents ``identity``'s client certificate."""
    context = ssl.create_default_context(cafile=str(ca))
    context.load_cert_chain(str(identity.cert), str(identity.key))
    return context


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _answers(
    url: str, accept: Callable[[httpx.Response], bool], verify: ssl.SSLContext | bool = True
) -> bool:
    try:
        return accept(httpx.get(url, timeout=2.0, verify=verify))
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def running(config: ControlPlaneConfig) -> Iterator[ControlPlane]:
    """A started control plane for the duration of a ``with`` block."""
    plane = ControlPlane(config)
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()
