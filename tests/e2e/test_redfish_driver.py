"""The Redfish driver against the real sushy-tools emulator (fake driver, TLS, basic auth)
serving several systems on ONE endpoint, as a blade chassis manager, a Redfish aggregator
or sushy-tools without per-host proxies does: each driver drives its own system only, a
system the BMC does not serve is an error naming the ones it does, never a fallback."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import httpx
import pytest

from metalmend.bmc.address import BmcAddress, parse
from metalmend.bmc.driver import PowerAction, PowerState
from metalmend.bmc.errors import AuthenticationFailed, BadAddress, BmcError
from metalmend.bmc.pool import BmcPool, BmcTarget, Credentials
from metalmend.bmc.redfish import RedfishDriver
from metalmend.bmc.settings import BmcSettings
from metalmend_lab.controlplane import LOOPBACK, free_port
from metalmend_lab.pki import CertificateAuthority
from tests.support import STARTUP, Deadline, until

USER = "chassis-admin"
PASSWORD = "Cl3ar-only-in-the-header"
# sushy-tools' fake driver lands a power change 1-11 s after the command.
POWER_CHANGE = 30.0
SETTINGS = BmcSettings(timeout=10.0)


@dataclass(frozen=True)
class Emulator:
    endpoint: str  # https://127.0.0.1:PORT
    ca_file: str
    systems: tuple[str, ...]  # system paths, as the Systems collection lists them
    log: Path

    def address(self, system: str = "") -> BmcAddress:
        return parse(f"redfish+https://{self.endpoint.removeprefix('https://')}{system}")

    def driver(self, system: str = "", password: str = PASSWORD) -> RedfishDriver:
        return RedfishDriver(self.address(system), USER, password, self.ca_file, SETTINGS)

    def posts(self) -> list[str]:
        """Every POST sushy-tools received, from its access log (a reset's effect lands
        seconds later; the log shows the command itself). The log is written after each
        answer: a marker request is sent and awaited first, so that the lines of every
        request answered before it are there."""
        mark = f"mark-{uuid.uuid4()}"
        trust = ssl.create_default_context(cafile=self.ca_file)
        httpx.get(f"{self.endpoint}/redfish/v1/?{mark}", verify=trust, timeout=10)
        deadline = Deadline(10)
        while mark not in (text := self.log.read_text()):
            assert not deadline.expired(), "sushy-tools did not log the marker request"
            time.sleep(0.05)
        return [line for line in text.splitlines() if "POST /redfish/" in line]

    def raw_power(self, system: str) -> str:
        """PowerState as sushy-tools reports it, read without the driver."""
        trust = ssl.create_default_context(cafile=self.ca_file)
        answer = httpx.get(self.endpoint + system, auth=(USER, PASSWORD), verify=trust, timeout=10)
        state: str = answer.raise_for_status().json()["PowerState"]
        return state


@contextlib.contextmanager
def emulator(workdir: Path, names: list[str]) -> Iterator[Emulator]:
    workdir.mkdir(parents=True, exist_ok=True)
    ca = CertificateAuthority(workdir / "pki")
    serving = ca.issue("bmc", "bmc", ip_addresses=(LOOPBACK,), server=True)
    auth = workdir / "htpasswd"
    auth.write_text(f"{USER}:{bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()}\n")
    ids = [str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{name}.{workdir}")) for name in names]
    port = free_port()
    settings = {
        "SUSHY_EMULATOR_LISTEN_IP": LOOPBACK,
        "SUSHY_EMULATOR_LISTEN_PORT": port,
        "SUSHY_EMULATOR_SSL_CERT": str(serving.cert),
        "SUSHY_EMULATOR_SSL_KEY": str(serving.key),
        "SUSHY_EMULATOR_AUTH_FILE": str(auth),
        "SUSHY_EMULATOR_FAKE_DRIVER": True,
        "SUSHY_EMULATOR_FAKE_SYSTEMS": [
            {"uuid": i, "name": n, "power_state": "On", "nics": []}
            for i, n in zip(ids, names, strict=True)
        ],
        "SUSHY_EMULATOR_STATE_DIR": str(workdir / "state"),
    }
    config = workdir / "emulator.conf"
    config.write_text("".join(f"{key} = {value!r}\n" for key, value in settings.items()))
    log = workdir / "emulator.log"
    argv = [sys.executable, "-m", "sushy_tools.emulator.main", "--config", str(config), "--fake"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    bmc = Emulator(
        f"https://{LOOPBACK}:{port}",
        str(ca.pair.cert),
        tuple(f"/redfish/v1/Systems/{i}" for i in ids),
        log,
    )
    trust = ssl.create_default_context(cafile=bmc.ca_file)
    try:
        deadline = Deadline(STARTUP)
        while True:
            try:
                httpx.get(f"{bmc.endpoint}/redfish/v1/", verify=trust, timeout=1)
                break
            except httpx.HTTPError:
                if process.poll() is not None or deadline.expired():
                    raise AssertionError(f"sushy-tools did not start:\n{log.read_text()}") from None
                time.sleep(0.1)
        yield bmc
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def chassis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """One endpoint serving three systems."""
    with emulator(tmp_path_factory.mktemp("chassis"), ["blade-a", "blade-b", "blade-c"]) as bmc:
        yield bmc


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """One endpoint serving one system."""
    with emulator(tmp_path_factory.mktemp("single"), ["only"]) as bmc:
        yield bmc


async def test_two_drivers_on_one_endpoint_each_power_their_own_system(chassis: Emulator) -> None:
    a_path, b_path, c_path = chassis.systems
    a, b = chassis.driver(a_path), chassis.driver(b_path)
    try:
        assert await a.power_state() == PowerState.ON
        assert await b.power_state() == PowerState.ON
        posts_before = len(chassis.posts())

        await a.act(PowerAction.HARD_OFF)
        sent = chassis.posts()[posts_before:]
        assert len(sent) == 1
        assert f"POST {a_path}/Actions/ComputerSystem.Reset " in sent[0]

        async def a_is_off_and_b_stays_on() -> bool:
            assert await b.power_state() == PowerState.ON
            return await a.power_state() == PowerState.OFF

        await until(a_is_off_and_b_stays_on, within=POWER_CHANGE)
        # Read without the driver: the emulator agrees on which server went off.
        assert chassis.raw_power(a_path) == "Off"
        assert chassis.raw_power(b_path) == "On"
        assert chassis.raw_power(c_path) == "On"

        await a.act(PowerAction.ON)

        async def a_is_on() -> bool:
            return await a.power_state() == PowerState.ON

        await until(a_is_on, within=POWER_CHANGE)
        assert await b.power_state() == PowerState.ON
    finally:
        await a.close()
        await b.close()


@pytest.mark.parametrize("action", [None, PowerAction.HARD_OFF], ids=["read", "power off"])
async def test_a_system_the_bmc_does_not_serve_is_a_bad_address_naming_its_systems(
    chassis: Emulator, action: PowerAction | None
) -> None:
    missing = "/redfish/v1/Systems/0b0e5f6c-not-served-here"
    driver = chassis.driver(missing)
    sent_before = chassis.posts()
    with pytest.raises(BadAddress) as caught:
        await (driver.power_state() if action is None else driver.act(action))
    await driver.close()
    message = str(caught.value)
    assert missing in message
    assert chassis.endpoint in message
    assert all(path in message for path in chassis.systems), message
    assert caught.value.error_type == "registration error"
    assert chassis.posts() == sent_before  # no command went to any other system


async def test_no_system_named_and_several_served_is_a_bad_address_listing_them(
    chassis: Emulator,
) -> None:
    driver = chassis.driver("")
    sent_before = chassis.posts()
    with pytest.raises(BadAddress, match="serves 3 systems") as caught:
        await driver.act(PowerAction.HARD_OFF)
    await driver.close()
    assert all(path in str(caught.value) for path in chassis.systems)
    assert "name one in spec.bmc.address" in str(caught.value)
    assert chassis.posts() == sent_before


async def test_a_system_named_by_its_name_not_its_listed_path_is_a_bad_address(
    chassis: Emulator,
) -> None:
    # sushy-tools redirects a system's name to its UUID path; we follow neither the
    # redirect nor a guess: the address must name a path the Systems collection lists.
    driver = chassis.driver("/redfish/v1/Systems/blade-a")
    with pytest.raises(BadAddress, match="serves no system /redfish/v1/Systems/blade-a"):
        await driver.power_state()
    await driver.close()


async def test_no_system_named_and_one_served_uses_it(single: Emulator) -> None:
    driver = single.driver("")
    try:
        assert await driver.power_state() == PowerState.ON
        assert await driver.power_state() == PowerState.ON  # the found system, cached
    finally:
        await driver.close()


async def test_a_wrong_password_is_an_authentication_failure_without_the_password(
    single: Emulator,
) -> None:
    wrong = "Wr0ng-" + PASSWORD
    driver = single.driver(password=wrong)
    with pytest.raises(AuthenticationFailed) as caught:
        await driver.power_state()
    await driver.close()
    assert "HTTP 401" in str(caught.value)
    assert wrong not in str(caught.value)
    assert PASSWORD not in str(caught.value)


async def test_an_untrusted_certificate_is_a_clear_error(single: Emulator) -> None:
    driver = RedfishDriver(single.address(), USER, PASSWORD, True, SETTINGS)  # system CAs only
    with pytest.raises(BmcError, match="certificate is not trusted") as caught:
        await driver.power_state()
    await driver.close()
    assert "BMC CA bundle" in str(caught.value)
    unverified = RedfishDriver(single.address(), USER, PASSWORD, False, SETTINGS)
    try:
        assert await unverified.power_state() == PowerState.ON
    finally:
        await unverified.close()


async def test_through_the_pool_fencing_one_system_leaves_its_neighbours_on(
    chassis: Emulator,
) -> None:
    # As the host controller does it: hosts whose addresses share the endpoint, one pool.
    pool = BmcPool(BmcSettings(timeout=10.0, ca_bundle=chassis.ca_file))
    a, b, c = (
        BmcTarget(chassis.address(path), Credentials(USER, PASSWORD), namespace="tenant")
        for path in chassis.systems
    )
    try:
        for target in (a, b, c):
            assert await pool.power_state(target) == PowerState.ON
        await pool.power_off(c, hard=True)

        async def c_is_off_and_the_others_stay_on() -> bool:
            assert await pool.power_state(a) == PowerState.ON
            assert await pool.power_state(b) == PowerState.ON
            return await pool.power_state(c) == PowerState.OFF

        await until(c_is_off_and_the_others_stay_on, within=POWER_CHANGE)
        assert [chassis.raw_power(path) for path in chassis.systems] == ["On", "On", "Off"]
        await pool.power_on(c)

        async def c_is_on() -> bool:
            return await pool.power_state(c) == PowerState.ON

        await until(c_is_on, within=POWER_CHANGE)
    finally:
        await pool.close()
