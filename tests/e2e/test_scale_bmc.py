"""The scale benchmark's BMC server (lab.scalebmc) as a process: real Redfish over TLS with
basic auth, one port per system, driven by metalmend's own BMC pool and Redfish driver
unchanged; resets journalled as the lab's BMCs journal them."""

from __future__ import annotations

import asyncio
import importlib.abc
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from metalmend.bmc import BmcPool, BmcTarget, Credentials, PowerState, parse, redfish
from metalmend.bmc.driver import PowerAction
from metalmend.bmc.errors import AuthenticationFailed
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.controlplane import LOOPBACK
from metalmend_lab.pki import CertificateAuthority
from tests.support import started

SYSTEMS = 3
Server = tuple[dict[str, Any], Path, Path]  # (ports file, CA, journal directory)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("scalebmc")
    ca = CertificateAuthority(tmp / "pki")
    serving = ca.issue("bmc", "scale-bmc", ip_addresses=(LOOPBACK,), server=True)
    config = {
        "cert": str(serving.cert), "key": str(serving.key), "ports_file": str(tmp / "ports.json"),
        "journal_dir": str(tmp), "journal": ["host-1"],
        "systems": [{"id": f"sys-{i}", "host": f"host-{i}", "username": f"u{i}",
                     "password": f"p{i}"} for i in range(SYSTEMS)],
    }  # fmt: skip
    (tmp / "config.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "metalmend_lab.scalebmc", str(tmp / "config.json")]
    process = subprocess.Popen(argv)
    try:
        started(
            (tmp / "ports.json").exists, f"the scale BMCs to listen ({tmp / 'ports.json'})", process
        )
        yield json.loads((tmp / "ports.json").read_text()), ca.pair.cert, tmp
    finally:
        process.terminate()
        process.wait(10)


def target(ports: dict[str, Any], index: int, password: str | None = None) -> BmcTarget:
    port = ports["systems"][f"sys-{index}"]
    address = parse(f"redfish://{LOOPBACK}:{port}/redfish/v1/Systems/sys-{index}")
    return BmcTarget(address, Credentials(f"u{index}", password or f"p{index}"))


async def test_the_pool_drives_each_system_on_its_own_port(server: Server) -> None:
    ports, ca, journal = server
    assert len(set(ports["systems"].values())) == SYSTEMS
    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(ca)))
    try:
        assert await pool.power_state(target(ports, 1)) == PowerState.ON
        await pool.act(target(ports, 1), PowerAction.HARD_OFF)
        assert await pool.power_state(target(ports, 1)) == PowerState.OFF
        assert await pool.power_state(target(ports, 2)) == PowerState.ON  # its own system
        await pool.act(target(ports, 1), PowerAction.ON)
        assert await pool.power_state(target(ports, 1)) == PowerState.ON
    finally:
        await pool.close()
    words = [
        line.split(" ", 1)[1] for line in (journal / "host-1.commands").read_text().splitlines()
    ]
    assert words == ["hard off", "on"]
    async with httpx.AsyncClient() as http:
        counters = (await http.get(f"http://{LOOPBACK}:{ports['control']}/counters")).json()
    assert counters["resets"] == 2
    assert counters["by_method"]["POST"] == 2


async def test_a_wrong_password_is_refused(server: Server) -> None:
    ports, ca, _ = server
    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(ca)))
    try:
        with pytest.raises(AuthenticationFailed):
            await pool.power_state(target(ports, 0, password="p1"))  # another system's
    finally:
        await pool.close()


async def test_an_idle_connection_is_closed_and_the_system_is_not_looked_up_again(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bmc.redfish.IDLE_CONNECTION: httpx keeps an expired connection until its client is
    used again; between two power polls every driver held one (benchmarks/scale.py)."""
    monkeypatch.setattr(redfish, "IDLE_CONNECTION", 0.2)
    ports, ca, _ = server
    address = target(ports, 2).address
    driver = redfish.RedfishDriver(address, "u2", "p2", str(ca), BmcSettings(timeout=10.0))
    try:
        assert await driver.power_state() == PowerState.ON
        assert driver._client is not None
        await asyncio.sleep(0.5)
        assert driver._client is None, "closed once idle"
        before = await requests(ports)
        assert await driver.power_state() == PowerState.ON  # connects again: one GET
        # Before the next await: on a busy machine that one may outlast IDLE_CONNECTION.
        assert driver._client is not None
        assert await requests(ports) - before == 1
    finally:
        await driver.close()


async def test_hang_up_closes_the_connection_at_once_and_keeps_the_system(
    server: Server,
) -> None:
    """After a routine poll the pool hangs up (BmcPool._call): the next call connects
    again but does not look the system up again."""
    ports, ca, _ = server
    address = target(ports, 2).address
    driver = redfish.RedfishDriver(address, "u2", "p2", str(ca), BmcSettings(timeout=10.0))
    try:
        assert await driver.power_state() == PowerState.ON
        driver.hang_up()
        assert driver._client is None, "closed at once"
        await asyncio.sleep(0)  # the closing task runs
        before = await requests(ports)
        assert await driver.power_state() == PowerState.ON
        assert await requests(ports) - before == 1
        driver.hang_up()
        driver.hang_up()  # twice: nothing left to close, no error
    finally:
        await driver.close()


class ImportLookups(importlib.abc.MetaPathFinder):
    """Records every module looked up on sys.path (an import not already in sys.modules)."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        self.names.append(name)
        return None  # the other finders go on as before


async def test_a_power_poll_looks_up_no_module(server: Server) -> None:
    """A poll is a new connection each time (the pool hangs up after it). httpcore imported
    sniffio at every connection and lock; while it was not installed each import searched
    sys.path again: 0.3 ms of CPU per poll (docs/scale.md, fix 13). Nothing a poll does may
    import."""
    ports, ca, _ = server
    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(ca)))
    lookups = ImportLookups()
    try:
        await pool.power_state(target(ports, 0), background=True)  # first use may import
        sys.meta_path.insert(0, lookups)
        for _ in range(3):
            assert await pool.power_state(target(ports, 0), background=True) == PowerState.ON
    finally:
        if lookups in sys.meta_path:
            sys.meta_path.remove(lookups)
        await pool.close()
    assert lookups.names == [], f"modules looked up during power polls: {lookups.names}"


async def requests(ports: dict[str, Any]) -> int:
    async with httpx.AsyncClient() as http:
        answer = await http.get(f"http://{LOOPBACK}:{ports['control']}/counters")
    total: int = answer.json()["requests"]
    return total


def test_a_journal_with_peers_names_the_process_that_sent_each_reset(tmp_path: Path) -> None:
    """``journal_peers`` (benchmarks/sharding.py tells replicas apart by it): each
    journalled reset names the process whose socket sent it, here this test's."""
    ca = CertificateAuthority(tmp_path / "pki")
    serving = ca.issue("bmc", "scale-bmc", ip_addresses=(LOOPBACK,), server=True)
    config = {
        "cert": str(serving.cert), "key": str(serving.key),
        "ports_file": str(tmp_path / "ports.json"), "journal_dir": str(tmp_path),
        "journal": ["host-0"], "journal_peers": True,
        "systems": [{"id": "sys-0", "host": "host-0", "username": "u0", "password": "p0"}],
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    argv = [sys.executable, "-m", "metalmend_lab.scalebmc", str(tmp_path / "config.json")]
    process = subprocess.Popen(argv)
    try:
        ports_file = tmp_path / "ports.json"
        started(ports_file.exists, f"the scale BMCs to listen ({ports_file})", process)
        ports = json.loads(ports_file.read_text())

        async def reboot() -> None:
            pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=str(ca.pair.cert)))
            try:
                await pool.act(target(ports, 0), PowerAction.HARD_OFF)
                await pool.act(target(ports, 0), PowerAction.ON)
            finally:
                await pool.close()

        asyncio.run(reboot())
    finally:
        process.terminate()
        process.wait(10)
    lines = (tmp_path / "host-0.commands").read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == [
        f"hard off pid={os.getpid()}",
        f"on pid={os.getpid()}",
    ]
