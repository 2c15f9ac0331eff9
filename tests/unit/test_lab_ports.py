"""The lab's ports (metalmend_lab.controlplane): a picked port is kept from the kernel's own
picks until its server binds it, and a component that lost its port anyway is started
again on a fresh one, saying so; the tests' deadlines stretch with the measured load."""

from __future__ import annotations

import logging
import socket
import sys
from pathlib import Path

import pytest

from metalmend_lab.controlplane import (
    PORT_TAKEN,
    ControlPlaneError,
    _ephemeral_range,
    free_port,
    free_udp_port,
    start_component,
)
from tests.support import Deadline, slowness, wait


def test_a_picked_port_is_outside_the_kernels_range_and_held_for_its_server() -> None:
    low, high = _ephemeral_range()
    port = free_port()
    assert not low <= port <= high, "bind(0) and outgoing connections take ports in the range"
    other = socket.socket()  # another lab's free_port binds plainly: passed over
    with other, pytest.raises(OSError, match="in use"):
        other.bind(("127.0.0.1", port))
    with socket.socket() as server:  # the server it is for (SO_REUSEADDR) binds it at once
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen(1)


def test_a_picked_udp_port_is_outside_the_kernels_range_and_free() -> None:
    low, high = _ephemeral_range()
    port = free_udp_port()
    assert not low <= port <= high
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server:
        server.bind(("127.0.0.1", port))


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


LOSES_ITS_PORT = _python(
    f"import sys; print('listen tcp 127.0.0.1:1: bind: {PORT_TAKEN}'); sys.exit(1)"
)
RUNS = _python("import time; time.sleep(60)")


def test_a_component_that_lost_its_port_is_started_again_on_a_fresh_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    tries: list[list[str]] = []

    def argv() -> list[str]:  # picks its port for each try, as the lab's components do
        tries.append(LOSES_ITS_PORT if not tries else RUNS)
        return tries[-1]

    caplog.set_level(logging.WARNING, "metalmend_lab.controlplane")
    component = start_component("server", argv, tmp_path, lambda: len(tries) == 2, timeout=60)
    try:
        assert component.running()
        assert tries == [LOSES_ITS_PORT, RUNS]
        (said,) = [r.getMessage() for r in caplog.records]
        assert "taken by another process" in said, said
        assert "fresh ports" in said, said
        assert PORT_TAKEN in said, "the log says what the component said"
    finally:
        component.stop()


def test_a_fixed_command_line_that_lost_its_port_fails_with_its_log(tmp_path: Path) -> None:
    """Without a function to pick fresh ports there is nothing to try again."""
    with pytest.raises(ControlPlaneError, match=PORT_TAKEN) as failed:
        start_component("server", LOSES_ITS_PORT, tmp_path, lambda: False, timeout=60)
    assert "exited during start-up" in str(failed.value)


def test_only_a_taken_port_is_tried_again(tmp_path: Path) -> None:
    tries: list[int] = []

    def argv() -> list[str]:
        tries.append(1)
        return _python("import sys; print('no such flag'); sys.exit(2)")

    with pytest.raises(ControlPlaneError, match="no such flag"):
        start_component("server", argv, tmp_path, lambda: False, timeout=60)
    assert tries == [1]


def test_deadlines_stretch_with_the_measured_slowness(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("METALMEND_TEST_SLOWNESS", "3")
    assert slowness() == 3.0
    deadline = Deadline(10)
    assert 29 < deadline.left() <= 30
    monkeypatch.setenv("METALMEND_TEST_SLOWNESS", "0.2")  # never shorter than written
    assert slowness() == 1.0


def test_a_failed_wait_says_what_it_waited_for_and_what_it_last_saw(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("METALMEND_TEST_SLOWNESS", "1")
    with pytest.raises(AssertionError) as failed:
        wait(lambda: False, 0.2, "the host on", state=lambda: "worker-1: power off")
    assert "the host on" in str(failed.value)
    assert "last seen: worker-1: power off" in str(failed.value)
    with pytest.raises(AssertionError, match=r"lambda: 1 > 2"):
        wait(lambda: 1 > 2, 0.2)  # unnamed: its source line
