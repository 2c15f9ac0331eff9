"""What the host power controller adds to a reboot, against an instant lab BMC, IPMI
(pyghmi's BMC) and Redfish (sushy-tools' emulator):

- request -> power-off: the reboot annotation written, to the power-off command received at
  the BMC (the BMCs journal every command with its time);
- on -> status: the BMC obeying power-on, to the status (lastPoweredOn) seen by a watcher.

p50 and p99 over 1,000 reboots per protocol (``METALMEND_BENCH_REBOOTS`` to change; hard
mode, one host, `metalmend run` as a process, as in production). Target: p99 under 200 ms.
Side by side, 1,000 power reads of the same BMC: through metalmend.bmc alone (no
controller, no Kubernetes), and for IPMI through Debian's ``ipmitool`` (one session, its
shell), an independent client that tells the BMC's own stalls from the client's.

Where the tails came from. IPMI (bmc/ipmi_wakeup.py): pyghmi lost the wake-up of an answer
that arrived before its reader waited, on both sides (our IPMI worker and the lab's pyghmi
BMC), and each loss cost a retransmission interval (0.5-1 s); a power command also cost
two round trips (pyghmi's ``set_power`` reads the power first). Redfish: every request
paid a new TCP and TLS handshake, because the lab emulator's server (werkzeug) closes every
connection, and a power command read the system again before its POST. It prints only
what this run measured: no figures of another run, commit or machine beside them (they
would read as a comparison nobody made). Prints numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from benchmarks.shared import one_reboot
from metalmend.api.resources import BareMetalHost
from metalmend_lab import lab
from metalmend_lab.emulator import KEEPALIVE_ENV, POWER_DELAY_ENV
from metalmend_lab.hosts import NAMESPACE

REBOOTS = int(os.environ.get("METALMEND_BENCH_REBOOTS", "1000"))
READS = 1000


async def run(running: lab.RunningLab, kind: str) -> None:
    client = AsyncClient(KubeConfig.from_file(running.kubeconfig))
    assert running.hardware is not None
    name = running.hardware.hosts[0].name
    commands = running.plane.workdir.parent / "hardware" / f"{name}.commands"
    for _ in range(100):  # until host-power has recorded lastPoweredOn once
        host: Any = await client.get(BareMetalHost, name, namespace=NAMESPACE)
        if ((host.get("status") or {}).get("provisioning") or {}).get("lastPoweredOn"):
            break
        await asyncio.sleep(0.1)
    to_off, to_status = [], []
    for _ in range(REBOOTS):
        off_ms, status_ms, _ = await one_reboot(client, name, commands)
        to_off.append(off_ms)
        to_status.append(status_ms)
    await client.close()
    print(f"reboot latency added by the host power controller, {kind}, {REBOOTS} reboots (ms)")
    for label, values in (
        ("request -> power-off at BMC", to_off),
        ("BMC on -> status updated", to_status),
    ):
        print(f"  {label:28} {summary(values)}")
    await bare_round_trips(running, kind)
    if kind == "ipmi":
        ipmitool_round_trips(running)


def summary(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100)
    slow = sum(1 for v in values if v > 200)
    return (
        f"p50 {q[49]:6.1f}  p90 {q[89]:6.1f}  p99 {q[98]:6.1f}  max {max(values):6.1f}"
        f"  over 200 ms: {slow}/{len(values)}"
    )


async def bare_round_trips(running: lab.RunningLab, kind: str, count: int = READS) -> None:
    """The same BMC through metalmend.bmc alone: no controller, no Kubernetes."""
    from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
    from metalmend.bmc.settings import BmcSettings

    assert running.hardware is not None
    spec = running.hardware.hosts[0]
    bmc = BmcTarget(parse(spec.address), Credentials(spec.username, spec.password))
    pool = BmcPool(BmcSettings(timeout=5, ca_bundle=str(running.plane.ca.pair.cert)))
    times = []
    for _ in range(count):
        began = time.perf_counter()
        await pool.power_state(bmc)
        times.append((time.perf_counter() - began) * 1000)
    await pool.close()
    print(f"  {f'bare {kind} power read':28} {summary(times)}")


def ipmitool_round_trips(running: lab.RunningLab, count: int = READS) -> None:
    """The same BMC through ipmitool's shell: one session, one command per line, as our
    worker keeps one session per BMC. Cipher suite 3: the lab BMC's only one."""
    if shutil.which("ipmitool") is None:
        print(f"  {'ipmitool power read':28} skipped: ipmitool not installed (make tools)")
        return
    assert running.hardware is not None
    spec = running.hardware.hosts[0]
    argv = ["ipmitool", "-I", "lanplus", "-C", "3", "-H", "127.0.0.1", "-p", str(spec.bmc_port)]
    argv += ["-U", spec.username, "-E", "shell"]  # -E: the password from IPMI_PASSWORD
    env = {**os.environ, "IPMI_PASSWORD": spec.password}
    shell = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, bufsize=1, env=env,
    )  # fmt: skip
    assert shell.stdin is not None
    assert shell.stdout is not None
    times = []
    try:
        for _ in range(count):
            began = time.perf_counter()
            shell.stdin.write("chassis power status\n")
            shell.stdin.flush()
            while "Chassis Power is" not in (line := shell.stdout.readline()):
                if not line:
                    raise RuntimeError("ipmitool ended")
            times.append((time.perf_counter() - began) * 1000)
    finally:
        shell.kill()
        shell.wait()
    print(f"  {'ipmitool power read':28} {summary(times)}")


def main() -> None:
    # The lab's Redfish power lands at once, as its IPMI power does (sushy-tools' fake
    # driver would take 1-11 s), and the emulator keeps connections open as BMCs do
    # (werkzeug's server closes every one: each request a new TLS handshake, ~20 ms here):
    # what is measured is the controller, not the emulator.
    os.environ[POWER_DELAY_ENV] = "0"
    os.environ[KEEPALIVE_ENV] = "1"
    for kind in ("ipmi", "redfish"):
        with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
            options = lab.LabOptions(
                lab_dir=Path(workdir), hosts=1, bmc=kind, boot_delay=0.0,
                controllers="host-power",
            )  # fmt: skip
            with lab.started(options) as running:
                asyncio.run(run(running, kind))


if __name__ == "__main__":
    main()
