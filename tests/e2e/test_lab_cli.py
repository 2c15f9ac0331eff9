"""``metalmend lab up/status/down`` as a user runs them: in a shell, against real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.settings import CONTROLLER_NAMES
from metalmend_lab.assets import find_binaries
from metalmend_lab.inventory import status_path
from metalmend_lab.lab import LabState, alive
from tests.support import Deadline


def metalmend(*args: str, lab_dir: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "metalmend", *args, "--dir", str(lab_dir)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def descendants_gone(pids: list[int], timeout: float = 10) -> bool:
    deadline = Deadline(timeout)
    while any(alive(p) for p in pids):
        if deadline.expired():
            return False
        time.sleep(0.1)
    return True


def test_detached_lab_serves_kubectl_and_down_leaves_nothing(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    started = metalmend("lab", "up", "--detach", lab_dir=lab_dir)
    assert started.returncode == 0, started.stderr
    assert "lab ready" in started.stdout
    state = LabState.read(lab_dir)
    assert state is not None
    pids = [state.supervisor_pid, *state.components.values()]
    assert set(state.components) == {
        "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "metalmend",
        "metalmend-serve",
    }  # fmt: skip
    # every controller by default (issue 37: a NodeHealthCheck or FenceRemediation made in
    # the lab was silently ignored)
    assert state.controllers == ",".join(CONTROLLER_NAMES)
    assert (lab_dir / "endpoints.json").exists()
    try:
        report = metalmend("lab", "status", lab_dir=lab_dir)
        assert report.returncode == 0
        assert "readyz ok" in report.stdout
        listed = f"metalmend run --controllers: {', '.join(CONTROLLER_NAMES)}"
        assert listed in report.stdout, report.stdout
        assert "machine API none" in report.stdout
        assert "teardown API https://127.0.0.1:" in report.stdout
        again = metalmend("lab", "up", "--detach", lab_dir=lab_dir)
        assert again.returncode == 1
        assert "already running" in again.stderr
        assert "Traceback" not in again.stderr

        kubectl = find_binaries(build_missing=False).kubectl
        if kubectl is not None:
            listed = subprocess.run(
                [
                    str(kubectl),
                    "--kubeconfig",
                    str(lab_dir / "kubeconfig"),
                    "get",
                    "baremetalhosts",
                ],
                capture_output=True,
                text=True,
                check=False,
            )
            assert listed.returncode == 0, listed.stderr
            assert "No resources found" in listed.stderr
    finally:
        stopped = metalmend("lab", "down", lab_dir=lab_dir)
    assert stopped.returncode == 0
    assert descendants_gone(pids)
    assert not (lab_dir / "endpoints.json").exists()  # nothing points at a stopped service
    assert metalmend("lab", "status", lab_dir=lab_dir).returncode == 1


def test_ctrl_c_on_a_foreground_lab_stops_cleanly(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    process = subprocess.Popen(
        [sys.executable, "-m", "metalmend", "lab", "up", "--dir", str(lab_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = Deadline(120)
    state = None
    while not deadline.expired() and not (state and state.ready):
        state = LabState.read(lab_dir)
        time.sleep(0.2)
    assert state is not None
    assert state.ready
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert "lab stopped" in stdout
    assert "Traceback" not in stderr
    assert descendants_gone(list(state.components.values()))
    assert not (lab_dir / "lab.json").exists()


def test_killed_supervisor_takes_its_control_plane_with_it(tmp_path: Path) -> None:
    lab_dir = tmp_path / "lab"
    assert metalmend("lab", "up", "--detach", lab_dir=lab_dir).returncode == 0
    state = LabState.read(lab_dir)
    assert state is not None
    os.kill(state.supervisor_pid, signal.SIGKILL)
    assert descendants_gone([state.supervisor_pid, *state.components.values()], timeout=20)
    assert metalmend("lab", "down", lab_dir=lab_dir).returncode == 0


@pytest.mark.parametrize(
    ("variable", "says"),
    [("TEST_ASSET_ETCD", "TEST_ASSET_ETCD=/nonexistent/etcd is not an executable file")],
)
def test_bad_asset_variable_gives_one_clear_line(tmp_path: Path, variable: str, says: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "metalmend", "lab", "up", "--dir", str(tmp_path / "lab")],
        capture_output=True,
        text=True,
        env={**os.environ, variable: "/nonexistent/etcd"},
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip() == f"metalmend: {says}"


def test_an_unknown_machine_api_gives_one_clear_line(tmp_path: Path) -> None:
    result = metalmend("lab", "up", "--machine-api", "rancher", lab_dir=tmp_path / "lab")
    assert result.returncode == 2
    assert "--machine-api must be one of none, capi, capi-metal3, openshift, not 'rancher'" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr


def test_capi_metal3_without_the_upstream_crds_gives_one_clear_line(tmp_path: Path) -> None:
    """Checked before anything starts: metalmend does not ship CAPM3's CRD."""
    env = {k: v for k, v in os.environ.items() if k != "METALMEND_UPSTREAM_CRDS"}
    result = subprocess.run(
        [sys.executable, "-m", "metalmend", "lab", "up", "--machine-api", "capi-metal3",
         "--dir", str(tmp_path / "lab")],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "METALMEND_UPSTREAM_CRDS" in lines[0]


def test_lab_with_hosts_reports_them_takes_faults_and_leaves_nothing_behind(
    tmp_path: Path,
) -> None:
    lab_dir = tmp_path / "lab"
    started = metalmend(
        "lab", "up", "--detach", "--hosts", "2", "--bmc", "mixed", "--boot-delay", "1",
        lab_dir=lab_dir,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    state = LabState.read(lab_dir)
    assert state is not None
    assert {"redfish-emulator", "hardware", "metalmend"} <= set(state.components)
    pids = [state.supervisor_pid, *state.components.values()]
    try:
        deadline = Deadline(60)
        report = ""
        while not deadline.expired():
            report = metalmend("lab", "status", lab_dir=lab_dir).stdout
            if report.count("True") == 2:
                break
            time.sleep(0.5)
        for expected in ("worker-0", "worker-1", "redfish", "ipmi", "running"):
            assert expected in report
        assert report.count("True") == 2, report
        fault = metalmend("lab", "fault", "worker-0", "bmc-down", lab_dir=lab_dir)
        assert fault.returncode == 0, fault.stderr
        time.sleep(0.5)
        assert "no (down)" in metalmend("lab", "status", lab_dir=lab_dir).stdout
        unknown = metalmend("lab", "fault", "worker-9", "hang", lab_dir=lab_dir)
        assert unknown.returncode == 2
        assert "no host 'worker-9'" in unknown.stderr
        bad = metalmend("lab", "fault", "worker-0", "explode", lab_dir=lab_dir)
        assert bad.returncode == 2
        assert "unknown fault 'explode'" in bad.stderr
    finally:
        stopped = metalmend("lab", "down", lab_dir=lab_dir)
    assert stopped.returncode == 0
    assert descendants_gone(pids)
    assert not (lab_dir / "endpoints.json").exists()  # nothing points at a stopped service
    leftover = subprocess.run(
        ["pgrep", "-f", str(lab_dir)], capture_output=True, text=True, check=False
    ).stdout.split()
    assert leftover == [], "no process that names the lab directory is left"


def until(condition: Callable[[], bool], within: float, what: str) -> None:
    deadline = Deadline(within)
    while not condition():
        if deadline.expired():
            raise AssertionError(f"not within {within:.0f}s: {what}")
        time.sleep(0.2)


def test_a_killed_controller_is_restarted_and_the_lab_stays_up(tmp_path: Path) -> None:
    """Issue 18: the controller's death tore the whole lab down. Now the supervisor
    restarts it (as a Deployment would), and the new one reconciles the hosts."""
    lab_dir = tmp_path / "lab"
    started = metalmend(
        "lab", "up", "--detach", "--hosts", "1", "--bmc", "redfish", "--boot-delay", "1",
        lab_dir=lab_dir,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    state = LabState.read(lab_dir)
    assert state is not None
    first = state.components["metalmend"]
    pids = [state.supervisor_pid, *state.components.values()]
    try:
        os.kill(first, signal.SIGKILL)

        def replaced() -> bool:
            now = LabState.read(lab_dir)
            return now is not None and now.components["metalmend"] != first

        until(replaced, within=60, what="a new controller process is recorded")
        state = LabState.read(lab_dir)
        assert state is not None
        second = state.components["metalmend"]
        pids.append(second)
        assert alive(second)
        assert not alive(first)
        assert alive(state.supervisor_pid), "the lab stays up"
        assert state.restarts == {"metalmend": 1}
        assert all(alive(pid) for name, pid in state.components.items())
        report = metalmend("lab", "status", lab_dir=lab_dir)
        assert report.returncode == 0
        rows = [re.findall(r"[\w-]+", line) for line in report.stdout.splitlines()]
        assert ["metalmend", str(second), "yes", "1"] in rows, report.stdout  # restarts: 1
        log = (lab_dir / "lab.log").read_text()
        assert f"metalmend (pid {first}) ended with signal SIGKILL" in log
        assert f"metalmend restarted (pid {second}, restart 1)" in log

        # The new controller reconciles: taking the host offline powers it off.
        kube = Client(KubeConfig.from_file(lab_dir / "kubeconfig"))
        kube.patch(
            BareMetalHost, "worker-0", {"spec": {"online": False}},
            namespace="metalmend-lab", patch_type=PatchType.MERGE,
        )  # fmt: skip

        def powered_off() -> bool:
            host = kube.get(BareMetalHost, "worker-0", namespace="metalmend-lab")
            hardware = json.loads(status_path(lab_dir).read_text())
            reported = (host.get("status") or {}).get("poweredOn")
            return reported is False and hardware["worker-0"]["power"] == "off"

        until(powered_off, within=60, what="worker-0 powered off by the restarted controller")
    finally:
        stopped = metalmend("lab", "down", lab_dir=lab_dir)
    assert stopped.returncode == 0
    assert descendants_gone(pids)
    assert not (lab_dir / "endpoints.json").exists()  # nothing points at a stopped service
