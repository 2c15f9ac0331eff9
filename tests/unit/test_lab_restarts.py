"""The lab supervisor restarts metalmend when it dies, with a growing wait; any other
component dying still stops the lab. Real (tiny) processes, no cluster."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from metalmend_lab.controlplane import Component, ControlPlane, ControlPlaneConfig
from metalmend_lab.lab import (
    RESTART_HEALTHY_RUN,
    RESTART_MAX_WAIT,
    LabError,
    LabState,
    Restarts,
    RunningLab,
)
from tests.support import Deadline


def test_the_wait_doubles_from_one_second_up_to_its_cap() -> None:
    waits = []
    restarts = Restarts()
    for _ in range(8):
        waits.append(restarts.wait())
        restarts.crashes += 1
    assert waits == [1, 2, 4, 8, 16, 30, 30, 30]
    restarts.crashes = 10_000  # no overflow however long it crash-loops
    assert restarts.wait() == RESTART_MAX_WAIT


def lab_with(tmp_path: Path, name: str, restartable: bool) -> tuple[RunningLab, list[str]]:
    plane = ControlPlane(ControlPlaneConfig(workdir=tmp_path / "controlplane"))
    state = LabState(supervisor_pid=0)
    said: list[str] = []
    running = RunningLab(state, plane, tmp_path / "kubeconfig", say=said.append)
    component = Component(name, [sys.executable, "-c", "pass"], tmp_path / f"{name}.log")
    component.start()
    running.extras[name] = component
    state.components[name] = component.pid or 0
    if restartable:
        running.restarting[name] = Restarts()
    component.process.wait()  # type: ignore[union-attr]  # it exits at once: a crash
    return running, said


def test_a_dead_controller_is_restarted_after_its_wait(tmp_path: Path) -> None:
    running, said = lab_with(tmp_path, "metalmend", restartable=True)
    first = running.state.components["metalmend"]
    running.check()  # found dead: scheduled, not yet restarted
    assert running.state.components["metalmend"] == first
    assert said == [
        f"metalmend (pid {first}) ended with exit code 0 after 0s; restarting it in 1s"
        f" (log: {tmp_path / 'metalmend.log'})"
    ]
    deadline = Deadline(30)
    while running.state.restarts.get("metalmend") != 1 and not deadline.expired():
        time.sleep(0.05)
        running.check()
    second = running.state.components["metalmend"]
    assert second != first
    assert running.state.restarts == {"metalmend": 1}
    assert said[-1] == f"metalmend restarted (pid {second}, restart 1)"
    recorded = LabState.read(tmp_path)
    assert recorded is not None
    assert (recorded.components, recorded.restarts) == ({"metalmend": second}, {"metalmend": 1})
    running.extras["metalmend"].stop()


def test_a_crash_loop_waits_longer_and_a_healthy_run_resets_the_wait(tmp_path: Path) -> None:
    running, said = lab_with(tmp_path, "metalmend", restartable=True)
    restarts = running.restarting["metalmend"]
    restarts.crashes = 3  # three short runs in a row
    running.check()
    assert "restarting it in 8s" in said[-1]
    restarts.due = None
    restarts.started -= RESTART_HEALTHY_RUN  # it had run a minute before this crash
    running.check()
    assert "restarting it in 1s" in said[-1]


def test_any_other_dead_component_still_stops_the_lab(tmp_path: Path) -> None:
    running, _ = lab_with(tmp_path, "hardware", restartable=False)
    with pytest.raises(LabError, match="hardware stopped unexpectedly"):
        running.check()
