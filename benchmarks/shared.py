"""What more than one benchmark needs: `metalmend run` as a process against a lab, the API
server's own request counts, and waiting for a condition."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from lightkube import AsyncClient
from lightkube.types import PatchType

from metalmend.api.names import REBOOT
from metalmend.api.resources import BareMetalHost
from metalmend.api.stamps import parse_stamp
from metalmend_lab import lab
from metalmend_lab.controlplane import ControlPlane, free_port
from metalmend_lab.hosts import NAMESPACE

WRITES = ("POST", "PATCH", "PUT", "APPLY", "DELETE")
# How long `metalmend run` may take to answer /readyz: a start on an idle machine takes a few
# seconds, one on a machine loaded 20 deep took more than a minute (connecting, listing,
# syncing its caches). Waiting longer costs nothing when the start is healthy, and a process
# that exits meanwhile fails the wait at once.
READY_WITHIN = 600.0


def apiserver_requests(plane: ControlPlane) -> Counter[tuple[str, str]]:
    """``apiserver_request_total`` summed by (verb, resource[/subresource]), every identity
    and response code together (the metric has no user label)."""
    with plane.admin_http() as http:
        text = http.get("/metrics").text
    totals: Counter[tuple[str, str]] = Counter()
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels = dict(
            part.split("=", 1) for part in line[line.index("{") + 1 : line.rindex("}")].split(",")
        )
        resource = labels.get("resource", '""').strip('"')
        if subresource := labels.get("subresource", '""').strip('"'):
            resource += f"/{subresource}"
        totals[labels.get("verb", '""').strip('"'), resource] += int(float(line.rsplit(" ", 1)[1]))
    return totals


def start_metalmend(
    running: lab.RunningLab,
    log: Path,
    controllers: str,
    *,
    kubeconfig: Path | None = None,
    source: Path | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    """`metalmend run --controllers ...` against the lab, as the lab runs it; returns the
    process and its health port once /readyz answers. ``kubeconfig``: another identity than
    the lab's admin; ``source``: another checkout's ``src`` directory, put first on the
    import path (to measure an older metalmend against the same lab)."""
    port = free_port()
    argv = lab.controller_argv(
        kubeconfig or running.kubeconfig, running.plane.ca.pair.cert, controllers, port, 30.0
    )
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + READY_WITHIN
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"metalmend exited ({process.returncode}) before it was ready; see {log}"
            )
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process, port
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    process.wait()
    raise RuntimeError(f"metalmend did not become ready within {READY_WITHIN:.0f}s; see {log}")


def wait(check: Callable[[], bool], within: float) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise TimeoutError(f"not done within {within:.0f}s")


def journal(path: Path, after: float, action: str) -> float | None:
    """When the BMC journal ``path`` first says ``action`` at or after ``after`` (a line may
    end in the sender, `` pid=N``: lab.scalebmc's ``journal_peers``)."""
    for line in path.read_text().splitlines() if path.exists() else []:
        stamp, _, what = line.partition(" ")
        if what.partition(" pid=")[0] == action and float(stamp) >= after:
            return float(stamp)
    return None


async def one_reboot(client: AsyncClient, name: str, commands: Path) -> tuple[float, ...]:
    """(request -> off at the BMC, BMC on -> status seen, request -> status seen), ms."""
    # A list of the one host: its resourceVersion is the collection's, now. The host's own
    # may be older than the API server's watch history when thousands of other hosts are
    # being written (benchmarks/scale.py: "too old resource version").
    only = {"metadata.name": name}
    listing: Any = client.list(BareMetalHost, namespace=NAMESPACE, fields=only)
    (host,) = [h async for h in listing]
    before = parse_stamp(host["status"]["provisioning"].get("lastPoweredOn"))
    watch = client.watch(
        BareMetalHost, namespace=NAMESPACE, fields=only, resource_version=listing.resourceVersion
    )
    asked = time.time()
    await client.patch(
        BareMetalHost, name, {"metadata": {"annotations": {REBOOT: '{"mode":"hard"}'}}},
        namespace=NAMESPACE, patch_type=PatchType.MERGE,
    )  # fmt: skip
    seen = None
    obj: Any
    async for _, obj in watch:
        provisioning = (obj.get("status") or {}).get("provisioning") or {}
        last = parse_stamp(provisioning.get("lastPoweredOn"))
        if obj.metadata.name == name and last is not None and before is not None and last > before:
            seen = time.time()
            break
    off, on = journal(commands, asked, "hard off"), journal(commands, asked, "on")
    assert seen is not None
    assert off is not None
    assert on is not None
    return ((off - asked) * 1000, (seen - on) * 1000, (seen - asked) * 1000)
