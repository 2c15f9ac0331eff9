"""The lab's servers: power, BMCs and kubelets, in one process (``python -m
metalmend_lab.hardware CONFIG``), started by ``metalmend lab up``.

Per host (what each part is lives in its own module; this one puts them together):
- power and BMC (``lab.bmcs``): for IPMI hosts the power lives here behind a pyghmi BMC
  on its own UDP port; for Redfish hosts it lives in sushy-tools' emulator and is read
  through Redfish;
- a fault line in front of the BMC (``lab.proxies``: UDP relay or TCP proxy) for bmc-down
  and bmc-slow;
- a kubelet simulator bound to that power and to the OS on its OS drive (``kubeletsim``,
  ``lab.osdrive``);
- the faults ``metalmend lab fault`` asks for (``lab.faults``), applied every 0.2 s.

What the hardware is comes from ``lab.inventory`` (written by ``metalmend lab up``); what
it looks like is written to ``status.json`` for ``metalmend lab status``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from metalmend_lab import siteetcd
from metalmend_lab.bmcs import HostPower, RedfishPower, start_ipmi_bmcs
from metalmend_lab.faults import FaultInjector
from metalmend_lab.inventory import HardwareConfig, HostSpec, status_path
from metalmend_lab.kubeletsim import KubeletSim
from metalmend_lab.osdrive import OsDrive
from metalmend_lab.proxies import TcpProxy, UdpRelay

log = logging.getLogger("metalmend_lab.hardware")


async def serve(config: HardwareConfig) -> None:
    lab_dir = Path(config.lab_dir)
    ipmi_hosts: list[tuple[HostSpec, HostPower]] = []
    kubelets: dict[str, KubeletSim] = {}
    injectors: dict[str, FaultInjector] = {}
    lines: dict[str, TcpProxy | UdpRelay] = {}
    for spec in config.hosts:
        powered: Callable[[], Awaitable[int | None]]
        ipmi_power: HostPower | None = None
        if spec.bmc == "ipmi":
            journal = lab_dir / "hardware" / f"{spec.name}.commands"
            clients = journal.with_suffix(".clients")
            ipmi_power = HostPower(True, spec.power_delay, journal, clients)
            ipmi_hosts.append((spec, ipmi_power))

            async def read_ipmi(power: HostPower = ipmi_power) -> int | None:
                return power.boot()

            powered = read_ipmi
            lines[spec.name] = UdpRelay("127.0.0.1", spec.internal_port, spec.bmc_port)
        else:
            powered = RedfishPower(spec, config.ca_file).boot
            lines[spec.name] = TcpProxy("127.0.0.1", spec.internal_port, listen_port=spec.bmc_port)
        kubelets[spec.name] = KubeletSim(spec, powered, OsDrive.of(lab_dir, spec.name))
        injectors[spec.name] = FaultInjector(
            lab_dir, spec.name, kubelets[spec.name], lines[spec.name], ipmi_power
        )
    start_ipmi_bmcs(ipmi_hosts)
    for line in lines.values():
        await line.start()
    tasks = [asyncio.create_task(k.run()) for k in kubelets.values()]
    # The site etcd's members live on their hosts, following each host's kubelet (siteetcd).
    members = {m.member.host: m for m in siteetcd.members_for(lab_dir, kubelets)}
    tasks += [asyncio.create_task(m.run()) for m in members.values()]
    log.info("hardware up: %d hosts", len(config.hosts))
    (lab_dir / "hardware" / "faults").mkdir(parents=True, exist_ok=True)
    written = ""  # the status file's text: written again only when it changes
    while True:
        report: dict[str, Any] = {}
        for spec in config.hosts:
            faults = injectors[spec.name].apply()
            kubelet = kubelets[spec.name]
            report[spec.name] = {
                "bmc": spec.bmc,
                "address": spec.address,
                "power": "on" if kubelet.state != "off" else "off",
                "kubelet": kubelet.state,
                "pods": kubelet.pods,
                "etcd": members[spec.name].state if spec.name in members else "-",
                "bmc_line": faults.bmc,
                "faults": asdict(faults),  # as applied: `lab fault` waits to see its own
            }
        text = json.dumps(report, indent=2)
        if text != written:
            tmp = status_path(lab_dir).with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(status_path(lab_dir))
            written = text
        for task in tasks:
            if task.done():
                task.result()
        await asyncio.sleep(0.2)


def main() -> None:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    config = HardwareConfig.read(Path(sys.argv[1]))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(config))


if __name__ == "__main__":
    main()
