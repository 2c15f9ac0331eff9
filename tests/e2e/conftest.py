"""One lab with hosts for the e2e tests: a Redfish host (sushy-tools) and an IPMI host
(pyghmi BMC), kubelet simulators, node-link running as ``metalmend run``."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest

from metalmend.bmc import BmcTarget, Credentials, parse
from metalmend.lab import lab
from metalmend.lab.controlplane import free_port
from metalmend.lab.inventory import HostSpec

LAB_GRACE = 6.0  # node-monitor grace period of the e2e lab


@pytest.fixture(scope="session")
def hosts_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("lab"),
        node_monitor_grace_period=LAB_GRACE,
        hosts=2,
        bmc="mixed",
        boot_delay=1.0,
        controllers="node-link",
    )
    with lab.started(options) as running:
        yield running


def host(running: lab.RunningLab, kind: str) -> HostSpec:
    assert running.hardware is not None
    return next(h for h in running.hardware.hosts if h.bmc == kind)


def target(spec: HostSpec, password: str | None = None) -> BmcTarget:
    return BmcTarget(parse(spec.address), Credentials(spec.username, password or spec.password))


class Metalmend:
    """`metalmend run --controllers ...` against a lab, as a process that can be killed -9."""

    def __init__(self, running: lab.RunningLab, controllers: str, soft_timeout: float) -> None:
        self.running = running
        self.controllers = controllers
        self.soft_timeout = soft_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.port = 0  # its /healthz, /readyz and /metrics, once started
        self.log = running.plane.workdir.parent / f"metalmend-{controllers.replace(',', '+')}.log"

    def start(self) -> None:
        port = self.port = free_port()
        argv = lab.controller_argv(
            self.running.kubeconfig, self.running.plane.ca.pair.cert, self.controllers, port,
            self.soft_timeout,
        )  # fmt: skip
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.1)
        raise AssertionError(f"metalmend ({self.controllers}) did not become ready")

    def kill(self) -> None:
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=15)
            self.process = None
