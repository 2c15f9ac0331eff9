"""What a failing host costs, one minute each: a wrong password (at a real lab BMC,
sushy-tools' Redfish emulator), a malformed address and an unreachable BMC.

For each case one BareMetalHost is created with ``online: true`` while ``metalmend run
--controllers host-power`` runs against the lab, and after one minute we count:

- BMC logins: requests the emulator refused with 401 (its own access log); for the other
  two cases nothing reaches a BMC, so the host's ``errorCount`` (failed attempts) is shown;
- reconciles: host-power's ``metalmend_reconcile_total`` from metalmend's /metrics, by
  outcome (``bmc_error`` are attempts, ``backoff`` are wake-ups answered from memory);
- API writes: the API server's own ``apiserver_request_total`` (POST/PATCH/PUT/DELETE) for
  baremetalhosts and events; the lab at rest writes nothing else to either.

Target (issue: 258 failed logins in 40 s, 80 reconciles a second, each BMCError Event
bumped 17 times a second): no more attempts than the backoff allows (1 s doubling: 7 in
the first minute; a wrong password: 1, then one after 5 minutes) and one status write per
attempt, one Event write per minute at most. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import asyncio
import base64
import re
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from lightkube import AsyncClient, KubeConfig
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from benchmarks.shared import WRITES, apiserver_requests, start_metalmend
from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import HOSTS_ANNOTATION, SECRET_LABEL, SECRET_LABEL_VALUE
from metalmend_lab import lab
from metalmend_lab.controlplane import ControlPlane, free_port
from metalmend_lab.hosts import NAMESPACE

WINDOW = 60.0


@dataclass
class Counts:
    case: str
    seconds: float
    logins_refused: int | None  # at the BMC (None: no BMC is reached)
    error_count: int  # the host's status.errorCount
    reconciles: dict[str, float]  # host-power, by outcome
    host_writes: int
    event_writes: int

    def line(self) -> str:
        logins = "-" if self.logins_refused is None else str(self.logins_refused)
        outcomes = ", ".join(f"{k} {v:g}" for k, v in sorted(self.reconciles.items()) if v)
        return (
            f"  {self.case:<15} {self.seconds:4.0f}s  logins refused {logins:>3}  errorCount"
            f" {self.error_count:>2}  reconciles: {outcomes or 'none'}  API writes:"
            f" hosts {self.host_writes}, events {self.event_writes}"
        )


def apiserver_writes(plane: ControlPlane) -> dict[str, int]:
    requests = apiserver_requests(plane)
    return {
        resource: sum(n for (verb, r), n in requests.items() if r == resource and verb in WRITES)
        for resource in ("baremetalhosts", "events")
    }


def reconciles(port: int) -> dict[str, float]:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    found: dict[str, float] = {}
    pattern = re.compile(
        r'^metalmend_reconcile_total\{controller="host-power",outcome="([^"]+)"\} (\S+)$'
    )
    for line in text.splitlines():
        if match := pattern.match(line):
            found[match.group(1)] = float(match.group(2))
    return found


def refused_logins(emulator_log: Path) -> int:
    """401 answers in the emulator's access log (werkzeug: '"GET /... HTTP/1.1" 401 -')."""
    if not emulator_log.exists():
        return 0
    return sum(1 for line in emulator_log.read_text(errors="replace").splitlines()
               if re.search(r'" 401 ', line))  # fmt: skip


async def measure(
    kube: AsyncClient,
    plane: ControlPlane,
    metalmend_port: int,
    emulator_log: Path,
    case: str,
    address: str,
    password: str,
    seconds: float,
) -> Counts:
    """Create one failing host, let it fail for ``seconds``, count, delete it."""
    name = f"failing-{case}"
    secret: Any = Secret(
        metadata=ObjectMeta(
            name=name,
            labels={SECRET_LABEL: SECRET_LABEL_VALUE},
            annotations={HOSTS_ANNOTATION: name},
        ),
        data={k: base64.b64encode(v.encode()).decode() for k, v in
              {"username": "admin", "password": password}.items()},
    )  # fmt: skip
    await kube.create(secret, namespace=NAMESPACE)
    writes, outcomes, logins = apiserver_writes(plane), reconciles(metalmend_port), None
    logins_before = refused_logins(emulator_log)
    host: Any = BareMetalHost(
        metadata=ObjectMeta(name=name),
        spec={"online": True, "bmc": {"address": address, "credentialsName": name}},
    )
    await kube.create(host, namespace=NAMESPACE)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    elapsed = time.monotonic() - started
    after = reconciles(metalmend_port)
    writes_after = apiserver_writes(plane)
    if case == "wrong-password":
        logins = refused_logins(emulator_log) - logins_before
    current: Any = await kube.get(BareMetalHost, name, namespace=NAMESPACE)
    error_count = int((current.get("status") or {}).get("errorCount") or 0)
    await kube.delete(BareMetalHost, name, namespace=NAMESPACE)
    await kube.delete(Secret, name, namespace=NAMESPACE)
    await asyncio.sleep(1)
    return Counts(
        case=case,
        seconds=elapsed,
        logins_refused=logins,
        error_count=error_count,
        reconciles={k: v - outcomes.get(k, 0.0) for k, v in after.items()},
        host_writes=writes_after["baremetalhosts"] - writes["baremetalhosts"] - 1,  # our create
        event_writes=writes_after["events"] - writes["events"],
    )


def cases(running: lab.RunningLab) -> list[tuple[str, str, str]]:
    """(case, address, password): the wrong password is at the lab's real Redfish BMC."""
    assert running.hardware is not None
    redfish = next(h for h in running.hardware.hosts if h.bmc == "redfish")
    return [
        ("wrong-password", redfish.address, redfish.password + "-wrong"),
        ("malformed", "redfish://10.0.0.1:notaport/redfish/v1/Systems/1", "secret"),
        ("unreachable", f"redfish://127.0.0.1:{free_port()}/redfish/v1/Systems/1", "secret"),
    ]


async def run_all(running: lab.RunningLab, port: int, seconds: float) -> list[Counts]:
    emulator_log = running.plane.workdir.parent / "hardware" / "redfish-emulator.log"
    kube = AsyncClient(KubeConfig.from_file(running.kubeconfig))
    try:
        return [
            await measure(kube, running.plane, port, emulator_log, case, address, password, seconds)
            for case, address, password in cases(running)
        ]
    finally:
        await kube.close()


def main(seconds: float = WINDOW) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        options = lab.LabOptions(lab_dir=Path(tmp), hosts=1, bmc="redfish", controllers="")
        with lab.started(options) as running:
            process, port = start_metalmend(running, Path(tmp) / "metalmend.log", "host-power")
            try:
                time.sleep(5)  # the lab host settles (its first reads and writes)
                results = asyncio.run(run_all(running, port, seconds))
            finally:
                process.terminate()
                process.wait(timeout=15)
    print(f"error loops: one failing host at a time, {seconds:g}s each (host-power only)")
    for counts in results:
        print(counts.line())
    print(
        "  before (issue): wrong password 258 logins in 40 s; malformed address 80"
        " reconciles/s; BMCError Events bumped 17/s"
    )


if __name__ == "__main__":
    main()
