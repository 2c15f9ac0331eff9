"""Each driver against a real protocol server: sushy-tools for Redfish, the lab's pyghmi BMC
for IPMI; and Debian's ipmitool as an independent client of the lab BMC. The IPMI driver's
process boundary: a stuck or cancelled call is ended by killing its worker, and the
worker's sockets listen on the address that reaches the BMC only."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from metalmend.bmc import (
    AuthenticationFailed,
    BmcPool,
    BmcTarget,
    Credentials,
    PowerState,
    TimedOut,
    Unreachable,
    ipmi,
    metrics,
    parse,
)
from metalmend.bmc.errors import BmcError
from metalmend.bmc.settings import BmcSettings
from metalmend_lab import lab
from metalmend_lab.controlplane import free_port
from tests.e2e.conftest import host, target
from tests.support import until

REDFISH_ADDRESS = "redfish+https://127.0.0.1:{port}/redfish/v1/Systems/1"
# sushy-tools' fake driver lands a power change 1-11 s after the command.
POWER_CHANGE = 20.0


@pytest.fixture
async def pool(hosts_lab: lab.RunningLab) -> AsyncIterator[BmcPool]:
    bmcs = BmcPool(BmcSettings(timeout=5, ca_bundle=str(hosts_lab.plane.ca.pair.cert)))
    yield bmcs
    await bmcs.close()


async def power_becomes(pool: BmcPool, bmc: BmcTarget, state: PowerState) -> None:
    async def reached() -> bool:
        return await pool.power_state(bmc) == state

    await until(reached, within=POWER_CHANGE)


@pytest.mark.parametrize("kind", ["redfish", "ipmi"])
async def test_on_soft_off_hard_off_and_state(
    hosts_lab: lab.RunningLab, pool: BmcPool, kind: str
) -> None:
    bmc = target(host(hosts_lab, kind))
    assert await pool.power_state(bmc) == PowerState.ON
    await pool.power_off(bmc, hard=False)
    await power_becomes(pool, bmc, PowerState.OFF)
    await pool.power_on(bmc)
    await power_becomes(pool, bmc, PowerState.ON)
    await pool.power_off(bmc, hard=True)
    await power_becomes(pool, bmc, PowerState.OFF)
    await pool.power_on(bmc)
    await power_becomes(pool, bmc, PowerState.ON)


@pytest.mark.parametrize("kind", ["redfish", "ipmi"])
async def test_wrong_password_is_an_authentication_error_without_the_password(
    hosts_lab: lab.RunningLab, pool: BmcPool, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("DEBUG")
    wrong = "Wr0ng-" + host(hosts_lab, kind).password
    with pytest.raises(AuthenticationFailed) as caught:
        await pool.power_state(target(host(hosts_lab, kind), password=wrong))
    assert caught.value.error_type == "registration error"
    assert wrong not in str(caught.value)
    assert wrong not in repr(caught.value.__cause__)
    assert wrong not in caplog.text


@pytest.mark.parametrize(
    ("address", "unreachable"),
    [
        pytest.param(REDFISH_ADDRESS, True, id="redfish"),
        pytest.param("ipmi://127.0.0.1:{port}", True, id="ipmi"),
    ],
)
async def test_a_closed_port_is_unreachable(pool: BmcPool, address: str, unreachable: bool) -> None:
    bmc = BmcTarget(
        parse(address.format(port=free_port())), Credentials("operator", "not-the-password")
    )
    with pytest.raises(Unreachable):
        await pool.power_state(bmc)


@contextlib.contextmanager
def silent_server(kind: int) -> Iterator[int]:
    """A socket that takes what is sent and never answers."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            sock.listen(8)  # connections complete in the backlog; nobody reads them
        yield sock.getsockname()[1]


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        pytest.param(REDFISH_ADDRESS, socket.SOCK_STREAM, id="redfish"),
        pytest.param("ipmi://127.0.0.1:{port}", socket.SOCK_DGRAM, id="ipmi"),
    ],
)
async def test_a_bmc_that_never_answers_times_out(address: str, kind: int) -> None:
    # (the system CAs trusted: a certificate is never shown; without a CA nothing is sent)
    bmcs = BmcPool(BmcSettings(timeout=2, trust_system_cas=True))
    with silent_server(kind) as port:
        bmc = BmcTarget(
            parse(address.format(port=port)), Credentials("operator", "not-the-password")
        )
        with pytest.raises(TimedOut):
            await bmcs.power_state(bmc)
    await bmcs.close()


@pytest.mark.skipif(shutil.which("ipmitool") is None, reason="make test installs ipmitool")
async def test_ipmitool_reads_and_changes_the_power_of_a_lab_bmc(
    hosts_lab: lab.RunningLab, pool: BmcPool
) -> None:
    spec = host(hosts_lab, "ipmi")
    base = ["ipmitool", "-I", "lanplus", "-H", "127.0.0.1", "-p", str(spec.bmc_port)]
    base += ["-U", spec.username, "-E"]  # -E: the password from $IPMI_PASSWORD, not argv

    def ipmitool(*args: str) -> str:
        return subprocess.run(
            [*base, *args], capture_output=True, text=True, check=True, timeout=30,
            env={"IPMI_PASSWORD": spec.password, "PATH": "/usr/bin:/bin"},
        ).stdout.strip()  # fmt: skip

    bmc = target(spec)
    await power_becomes(pool, bmc, PowerState.ON)
    assert await asyncio.to_thread(ipmitool, "power", "status") == "Chassis Power is on"
    await asyncio.to_thread(ipmitool, "power", "off")
    await power_becomes(pool, bmc, PowerState.OFF)
    assert await asyncio.to_thread(ipmitool, "power", "status") == "Chassis Power is off"
    await asyncio.to_thread(ipmitool, "power", "on")
    await power_becomes(pool, bmc, PowerState.ON)


def alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as ended). Reaped between the open and
    the read, /proc answers the read with ESRCH (ProcessLookupError): ended too."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def udp_sockets_of(pids: list[int]) -> list[str]:
    """Local addresses of the UDP sockets ``pids`` hold, as `ss -uanp` lists them."""
    listing = subprocess.run(["ss", "-uanp"], capture_output=True, text=True, check=True)
    return [
        line.split()[3]
        for line in listing.stdout.splitlines()[1:]
        if any(f"pid={pid}," in line for pid in pids)
    ]


@pytest.mark.skipif(shutil.which("ss") is None, reason="make test installs ss (iproute2)")
async def test_ipmi_sockets_listen_only_on_the_address_that_reaches_the_bmc(
    hosts_lab: lab.RunningLab, pool: BmcPool
) -> None:
    bmc = target(host(hosts_lab, "ipmi"))
    assert await pool.power_state(bmc) == PowerState.ON
    pids = pool.ipmi_workers.pids()
    assert pids, "the call ran in a worker process"
    sockets = udp_sockets_of(pids)
    assert sockets, "the worker's session socket is listed"
    wildcard = [s for s in sockets if s.startswith(("0.0.0.0:", "[::]:", "*:"))]
    assert wildcard == [], f"IPMI sockets listening on every interface: {wildcard}"
    assert all(s.startswith("127.0.0.1:") for s in sockets), sockets


async def test_wrong_ipmi_users_on_one_bmc_do_not_leave_it_busy(hosts_lab: lab.RunningLab) -> None:
    """Three hosts with wrong IPMI users on one BMC, then deleted: the BMC used to stay
    "busy with a command that does not end" until metalmend restarted, because pyghmi's
    login for an unknown user never ended and held pyghmi's process-wide state. Now each
    call ends at its deadline (its worker killed) and the right user is served at once."""
    spec = host(hosts_lab, "ipmi")
    bmcs = BmcPool(BmcSettings(timeout=4))
    try:
        for user in ("intruder-1", "intruder-2", "intruder-3"):
            wrong = BmcTarget(parse(spec.address), Credentials(user, spec.password))
            with pytest.raises(BmcError) as caught:
                await bmcs.power_state(wrong)
            assert spec.password not in str(caught.value)
        # The hosts are gone; nothing of their calls lives on:
        assert await bmcs.power_state(target(spec)) == PowerState.ON
    finally:
        await bmcs.close()


@contextlib.contextmanager
def answers_only_the_probe() -> Iterator[int]:
    """A UDP port that answers the first packet (the driver's preflight) and no other:
    pyghmi's login there does not end before the call's deadline."""
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind(("127.0.0.1", 0))
    server.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        answered = False
        while not done.is_set():
            try:
                _, sender = server.recvfrom(512)
            except TimeoutError:
                continue
            if not answered:
                server.sendto(b"\x06\x00\xff\x07", sender)
                answered = True

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        thread.join()
        server.close()


async def test_unknown_users_and_wrong_passwords_are_refused_logins_and_the_host_goes_on(
    hosts_lab: lab.RunningLab,
) -> None:
    """Hosts of another tenant naming this BMC with a user it does not know, or with the
    right user and a wrong password, one after the other with the BMC's own host: each is
    a refused login at once (was: "did not answer", each holding the BMC until the
    deadline), and the own host is served every time (was: its call timed out after a
    wrong password for its user, pyghmi handing it a dead session)."""
    spec = host(hosts_lab, "ipmi")
    bmcs = BmcPool(BmcSettings(timeout=5))
    own = target(spec)
    try:
        for round_ in range(3):
            for user, password in (("nobody-here", spec.password), (spec.username, "Wr0ng")):
                wrong = BmcTarget(parse(spec.address), Credentials(user, password), namespace="t2")
                with pytest.raises(AuthenticationFailed, match="refused the login"):
                    await bmcs.power_state(wrong)
                assert await bmcs.power_state(own) == PowerState.ON, f"round {round_}"
    finally:
        await bmcs.close()


async def test_a_cancelled_ipmi_call_ends_its_worker(hosts_lab: lab.RunningLab) -> None:
    spec = host(hosts_lab, "ipmi")
    bmcs = BmcPool(BmcSettings(timeout=60))
    try:
        with answers_only_the_probe() as port:
            mute = BmcTarget(parse(f"ipmi://127.0.0.1:{port}"), Credentials("u", "p"))
            call = asyncio.create_task(bmcs.power_state(mute))  # a login that does not end

            async def in_a_worker() -> bool:
                return bool(bmcs.ipmi_workers.pids())

            await until(in_a_worker, within=10)
            (pid,) = bmcs.ipmi_workers.pids()
            await asyncio.sleep(0.5)  # let the login get under way inside pyghmi
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call

            async def ended() -> bool:
                return not alive(pid)

            await until(ended, within=5)
            assert await bmcs.power_state(target(spec)) == PowerState.ON  # on a fresh worker
            assert pid not in bmcs.ipmi_workers.pids()
    finally:
        await bmcs.close()


async def test_a_worker_slow_to_start_outlives_the_call_that_gave_up_and_serves_the_next(
    hosts_lab: lab.RunningLab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a loaded machine a worker's start (Python importing pyghmi) can take longer than
    a call's deadline. The call gives up; the worker is not killed for it but comes up for
    the next call: one start, not one per call (was: every call killed the worker it was
    waiting for and the next started another, so an IPMI BMC answering in milliseconds
    read "did not answer" for as long as the load lasted)."""
    gate = tmp_path / "imports-done"
    slow = tmp_path / "slow-worker"  # the worker, held back until the test opens the gate
    slow.write_text(
        f"#!/bin/sh\nwhile [ ! -e {gate} ]; do sleep 0.05; done\n"
        f"exec {sys.executable} -m metalmend.bmc.ipmi_worker\n"
    )
    slow.chmod(0o755)
    monkeypatch.setattr(ipmi, "WORKER_COMMAND", (str(slow),))
    spec = host(hosts_lab, "ipmi")
    bmcs = BmcPool(BmcSettings(timeout=1))
    starts = metrics.IPMI_WORKER_STARTS._value.get()
    try:
        with pytest.raises(TimedOut):
            await bmcs.power_state(target(spec))
        with pytest.raises(TimedOut):  # a second call waits on the same start
            await bmcs.power_state(target(spec))
        gate.touch()

        async def served() -> bool:
            try:
                return await bmcs.power_state(target(spec)) == PowerState.ON
            except TimedOut:
                return False  # still starting on a busy machine

        await until(served, within=60, what="the held-back worker serves a power read")
        assert metrics.IPMI_WORKER_STARTS._value.get() - starts == 1
    finally:
        await bmcs.close()
