"""What the host power controller adds to a reboot, against an instant lab IPMI BMC:

- request -> power-off: the reboot annotation written, to the power-off command received at
  the BMC (the BMC journals every command with its time);
- on -> status: the BMC obeying power-on, to the status (lastPoweredOn) seen by a watcher.

p50 and p99 over 200 reboots (hard mode, one host, `metalmend run` as a process, as in
production). Target: p99 under 200 ms. Side by side: how often a bare pyghmi round trip to
the same BMC stalls on pyghmi's retransmission timer (0.5-1 s), which is where the tail
comes from. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from lightkube import AsyncClient, KubeConfig

from benchmarks.shared import one_reboot
from metalmend.api.resources import BareMetalHost
from metalmend.lab import lab
from metalmend.lab.hosts import NAMESPACE

REBOOTS = 200


async def run(running: lab.RunningLab) -> None:
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
    print(f"reboot latency added by the host power controller, {REBOOTS} reboots (ms)")
    for label, values in (
        ("request -> power-off at BMC", to_off),
        ("BMC on -> status updated", to_status),
    ):
        print(f"  {label:28} {summary(values)}")
    await bare_round_trips(running)


def summary(values: list[float]) -> str:
    q = statistics.quantiles(values, n=100)
    slow = sum(1 for v in values if v > 200)
    return (
        f"p50 {q[49]:6.1f}  p90 {q[89]:6.1f}  p99 {q[98]:6.1f}  max {max(values):6.1f}"
        f"  over 200 ms: {slow}/{len(values)}"
    )


async def bare_round_trips(running: lab.RunningLab, count: int = 1000) -> None:
    """The same BMC through metalmend.bmc alone: no controller, no Kubernetes."""
    from metalmend.bmc import BmcPool, BmcTarget, Credentials, parse
    from metalmend.bmc.settings import BmcSettings

    assert running.hardware is not None
    spec = running.hardware.hosts[0]
    bmc = BmcTarget(parse(spec.address), Credentials(spec.username, spec.password))
    pool = BmcPool(BmcSettings(timeout=5))
    times = []
    for _ in range(count):
        began = time.perf_counter()
        await pool.power_state(bmc)
        times.append((time.perf_counter() - began) * 1000)
    await pool.close()
    print(f"  {'bare IPMI power read':28} {summary(times)}")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as workdir:
        options = lab.LabOptions(
            lab_dir=Path(workdir), hosts=1, bmc="ipmi", boot_delay=0.0,
            controllers="host-power",
        )  # fmt: skip
        with lab.started(options) as running:
            asyncio.run(run(running))


if __name__ == "__main__":
    main()
