"""One lab with hosts for the e2e tests: a Redfish host (sushy-tools) and an IPMI host
(pyghmi BMC), kubelet simulators, node-link running as ``metalmend run``."""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Iterator

import pytest

from metalmend.bmc import BmcError, BmcPool, BmcSettings, BmcTarget, Credentials, parse
from metalmend_lab import lab
from metalmend_lab.controlplane import PORT_TAKEN, PORT_TRIES, free_port
from metalmend_lab.inventory import HostSpec
from tests.support import STARTUP, Deadline, answers, started

LAB_GRACE = 6.0  # node-monitor grace period of the e2e lab
LOG_LINES_ON_FAILURE = 80

_started: list[Metalmend] = []  # started during the test being run


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test that ran `metalmend run` reports the end of its log: the lab (and the
    log with it) is gone by the time anyone reads the failure."""
    report = yield
    if call.when == "call":
        if getattr(report, "failed", False):
            for process in _started:
                tail = process.log_tail(LOG_LINES_ON_FAILURE)
                report.sections.append((f"metalmend run {process.controllers} (log end)", tail))
        _started.clear()
    return report


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
        bmcs_answer(running)
        yield running


def bmcs_answer(running: lab.RunningLab, within: float = STARTUP) -> None:
    """Every host's BMC answers a power read through metalmend's own drivers, so that no
    test spends its first BMC deadline on a BMC still starting on a busy machine."""

    async def read_all() -> None:
        assert running.hardware is not None
        pool = BmcPool(BmcSettings(timeout=10, ca_bundle=str(running.plane.ca.pair.cert)))
        waiting = {h.name: h for h in running.hardware.hosts}
        last: dict[str, str] = {}
        deadline = Deadline(within)
        try:
            while waiting:
                for name, spec in list(waiting.items()):
                    try:
                        await pool.power_state(target(spec))
                        del waiting[name]
                    except BmcError as error:
                        last[name] = str(error)
                if waiting and deadline.expired():
                    raise AssertionError(
                        f"waited {deadline} for the lab's BMCs to answer a power read;"
                        " still silent: "
                        + "; ".join(f"{n} ({waiting[n].bmc}): {last.get(n)}" for n in waiting)
                    )
                if waiting:
                    await asyncio.sleep(0.5)
        finally:
            await pool.close()

    asyncio.run(read_all())


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
        """Start and wait for /readyz; started again on a fresh port when the one picked
        was taken meanwhile ("address already in use", as lab.start_component does)."""
        for attempt in range(1, PORT_TRIES + 1):
            port = self.port = free_port()
            argv = lab.controller_argv(
                self.running.kubeconfig, self.running.plane.ca.pair.cert, self.controllers,
                port, self.soft_timeout,
            )  # fmt: skip
            begun_at = self.log.stat().st_size if self.log.exists() else 0
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            if self not in _started:
                _started.append(self)
            try:
                started(
                    answers(f"http://127.0.0.1:{port}/readyz"),
                    f"metalmend run --controllers {self.controllers} to answer 200 on"
                    f" http://127.0.0.1:{port}/readyz (log: {self.log})",
                    self.process,
                )
                return
            except AssertionError:
                said = self.log.read_bytes()[begun_at:].decode(errors="replace").lower()
                if self.process.poll() is None or PORT_TAKEN not in said:
                    raise
                if attempt == PORT_TRIES:
                    raise
                print(f"metalmend run: port {port} was taken before it bound it; again")

    def log_tail(self, lines: int) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"(no log: {error.strerror})"

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
