"""What metalmend costs at rest: API requests and BMC reads per host per minute, once the
lab's hosts have settled, for this tree and for the code before the cached reads (commit
cff55bd: the BMC Secret read from the API server on every reconcile, every status write
waking its own key again), side by side in one run.

Each version gets a fresh lab of the same shape (4 hosts, Redfish and IPMI alternating,
the fence MachineHealthCheck) and `metalmend run` with every controller the lab runs by
default, as a process, under its own identity (user ``metalmend``, a client certificate in
``system:masters``, so both versions are authorised alike). Once every host is Ready, has
its power recorded and metalmend has written nothing for 10 s (or after 60 s: a version
that never stops writing never settles), we count for 60 s:

- API requests by metalmend, verb x resource: from the API server's audit log, which the
  lab's kube-apiserver writes for that user alone (a Metadata-level policy). The audit log
  is the exact count: ``apiserver_request_total`` has no user label, and the lab's kubelets,
  controller-manager and scheduler read and write all the time. The same window's
  ``apiserver_request_total`` (every identity) is printed beside it for Secrets and for
  the resources metalmend writes: nothing else in the lab reads Secrets at rest.
- BMC reads: IPMI, Get Chassis Status commands answered by the lab BMCs (their journal,
  ``hardware/<host>.commands``, "status" lines); Redfish, requests in the sushy-tools
  emulator's access log that are not the kubelet simulator's (it marks its own).

Run: ``python -m benchmarks.at_rest [--metalmend-src PATH]``, PATH a checkout (or its
``src``) of the code to compare with; without it, a temporary ``git worktree`` of cff55bd
is made and removed. Prints numbers; asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from lightkube import Client
from lightkube.resources.core_v1 import Node

from benchmarks.shared import WRITES, apiserver_requests, start_metalmend, wait
from metalmend.api.resources import BareMetalHost
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE, fence_health_check

HOSTS = 4
WINDOW = 60.0
QUIET = 10.0  # settled: no write by metalmend for this long...
SETTLE_WITHIN = 60.0  # ...or this long after it started, whichever comes first
USER = "metalmend"
BEFORE = "cff55bd"
REPOSITORY = Path(__file__).resolve().parents[1]
# The audit verbs that change something (apiserver_request_total's are WRITES).
AUDIT_WRITES = ("create", "update", "patch", "delete", "deletecollection")
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    # One event per request: a watch when it starts, everything else when it completes.
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": [USER]}, {"level": "None"}],
}


@dataclass
class Measurement:
    """One version's window."""

    label: str
    seconds: float
    settled_after: float | None  # seconds after metalmend was ready; None: never quiet
    requests: Counter[tuple[str, str]]  # metalmend's, (audit verb, resource)
    every_identity: Counter[tuple[str, str]]  # apiserver_request_total's delta
    ipmi_reads: int
    ipmi_hosts: int
    redfish_requests: int
    redfish_hosts: int
    # From `metalmend run` starting until settled: the first status writes, and whatever
    # they wake again.
    startup_seconds: float
    startup_requests: Counter[tuple[str, str]]
    startup_bmc: int

    @property
    def hosts(self) -> int:
        return self.ipmi_hosts + self.redfish_hosts

    def per_host_minute(self, count: float) -> float:
        return count * 60.0 / self.seconds / self.hosts

    def figures(self) -> dict[str, float]:
        """The summary rows, per host per minute."""
        total, secrets, writes = kinds_of(self.requests)
        return {
            "API requests by metalmend": self.per_host_minute(total),
            "  Secret reads (get, list)": self.per_host_minute(secrets),
            "  writes (create/update/patch/delete)": self.per_host_minute(writes),
            "BMC reads": self.per_host_minute(self.ipmi_reads + self.redfish_requests),
            "  IPMI (Get Chassis Status), per IPMI host": (
                self.ipmi_reads * 60.0 / self.seconds / max(self.ipmi_hosts, 1)
            ),
            "  Redfish (HTTP requests), per Redfish host": (
                self.redfish_requests * 60.0 / self.seconds / max(self.redfish_hosts, 1)
            ),
        }

    def startup_figures(self) -> dict[str, float]:
        """The start-up rows, per host for the whole phase."""
        total, secrets, writes = kinds_of(self.startup_requests)
        return {
            "API requests by metalmend": total / self.hosts,
            "  Secret reads (get, list)": secrets / self.hosts,
            "  writes (create/update/patch/delete)": writes / self.hosts,
            "BMC reads": self.startup_bmc / self.hosts,
        }


def kinds_of(requests: Counter[tuple[str, str]]) -> tuple[int, int, int]:
    """(all requests, Secret reads, writes)."""
    secrets = sum(n for (v, r), n in requests.items() if r == "secrets" and v in ("get", "list"))
    writes = sum(n for (v, _), n in requests.items() if v in AUDIT_WRITES)
    return sum(requests.values()), secrets, writes


def audit_events(path: Path, since: float, until: float) -> Iterator[dict[str, Any]]:
    """metalmend's requests received in [since, until) (wall-clock seconds)."""
    if not path.exists():
        return
    for line in path.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            event: dict[str, Any] = json.loads(line)
            watch = event.get("verb") == "watch"
            if event.get("stage") != ("ResponseStarted" if watch else "ResponseComplete"):
                continue
            received = datetime.fromisoformat(event["requestReceivedTimestamp"]).timestamp()
            if since <= received < until:
                yield event


def by_verb_and_resource(events: Iterator[dict[str, Any]]) -> Counter[tuple[str, str]]:
    found: Counter[tuple[str, str]] = Counter()
    for event in events:
        ref = event.get("objectRef") or {}
        resource = ref.get("resource") or event.get("requestURI", "?").split("?")[0]
        if ref.get("subresource"):
            resource += "/" + ref["subresource"]
        found[event["verb"], resource] += 1
    return found


def last_write(path: Path) -> float | None:
    stamps = [
        datetime.fromisoformat(e["requestReceivedTimestamp"]).timestamp()
        for e in audit_events(path, 0.0, float("inf"))
        if e["verb"] in AUDIT_WRITES
    ]
    return max(stamps, default=None)


def lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.exists() else []


def bmc_lines(running: lab.RunningLab) -> tuple[list[str], list[str]]:
    """(IPMI journal "status" lines of every IPMI host, emulator requests not the
    kubelet's), as written so far."""
    assert running.hardware is not None
    hardware = running.plane.workdir.parent / "hardware"
    ipmi = [
        line
        for host in running.hardware.hosts
        if host.bmc == "ipmi"
        for line in lines(hardware / f"{host.name}.commands")
        if line.endswith(" status")
    ]
    redfish = [
        line
        for line in lines(hardware / "redfish-emulator.log")
        if '"GET /' in line or '"POST /' in line or '"PATCH /' in line
        if "reader=kubelet" not in line
    ]
    return ipmi, redfish


def nodes_ready(client: Client, hosts: int) -> bool:
    """Every host's Node is Ready (from the API: ``lab status`` would probe the BMCs, and
    those probes would be counted as reads)."""
    ready = [
        node
        for node in client.list(Node)
        if any(
            c.type == "Ready" and c.status == "True"
            for c in (node.status.conditions if node.status else None) or []
        )
    ]
    return len(ready) == hosts


def settled(running: lab.RunningLab, audit: Path, ready_at: float) -> float | None:
    """Wait until the hosts are Ready with their power recorded and metalmend has not
    written for QUIET seconds; the seconds that took, or None after SETTLE_WITHIN."""
    assert running.hardware is not None
    client, hosts = running.client(), len(running.hardware.hosts)
    while (now := time.time()) - ready_at < SETTLE_WITHIN:
        hosts_ok = nodes_ready(client, hosts)
        powered = all(
            (host.get("status") or {}).get("poweredOn") is not None
            for host in client.list(BareMetalHost, namespace=NAMESPACE)
        )
        quiet_since = max(last_write(audit) or ready_at, ready_at)
        if hosts_ok and powered and now - quiet_since >= QUIET:
            return now - ready_at
        time.sleep(1.0)
    return None


def measure(
    label: str, source: Path | None, workdir: Path, hosts: int, window: float
) -> Measurement:
    """A fresh lab, `metalmend run` from ``source`` (None: this tree), one window."""
    workdir.mkdir(parents=True, exist_ok=True)
    policy, audit = workdir / "audit-policy.yaml", workdir / "audit.log"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    options = lab.LabOptions(
        lab_dir=workdir / "lab", hosts=hosts, bmc="mixed", controllers="",
        apiserver_args=(f"--audit-policy-file={policy}", f"--audit-log-path={audit}"),
    )  # fmt: skip
    with lab.started(options) as running:
        assert running.hardware is not None
        fence_health_check(running.client(), 30.0, power_off=60, power_on=120)
        wait(lambda: nodes_ready(running.client(), hosts), 120)
        kubeconfig = running.plane.user_kubeconfig(USER, ("system:masters",))
        began, (ipmi_began, redfish_began) = time.time(), bmc_lines(running)
        process, _ = start_metalmend(
            running, workdir / "metalmend.log", lab.DEFAULT_CONTROLLERS,
            kubeconfig=kubeconfig, source=source,
        )  # fmt: skip
        try:
            settled_after = settled(running, audit, time.time())
            ipmi_before, redfish_before = bmc_lines(running)
            every_before = apiserver_requests(running.plane)
            since = time.time()
            time.sleep(window)
            until = time.time()
            every_after = apiserver_requests(running.plane)
            ipmi_after, redfish_after = bmc_lines(running)
        finally:
            process.terminate()
            process.wait(timeout=15)
        time.sleep(1.0)  # the audit log has the window's last requests
        kinds = Counter(h.bmc for h in running.hardware.hosts)
        return Measurement(
            label=label,
            seconds=until - since,
            settled_after=settled_after,
            requests=by_verb_and_resource(audit_events(audit, since, until)),
            every_identity=every_after - every_before,
            ipmi_reads=len(ipmi_after) - len(ipmi_before),
            ipmi_hosts=kinds["ipmi"],
            redfish_requests=len(redfish_after) - len(redfish_before),
            redfish_hosts=kinds["redfish"],
            startup_seconds=since - began,
            startup_requests=by_verb_and_resource(audit_events(audit, began, since)),
            startup_bmc=len(ipmi_before)
            + len(redfish_before)
            - len(ipmi_began)
            - len(redfish_began),
        )


@contextlib.contextmanager
def before_tree(given: Path | None, workdir: Path) -> Iterator[Path]:
    """The ``src`` directory of the code to compare with: ``given``, or a temporary
    worktree of BEFORE (this repository's HEAD is not touched)."""
    if given is not None:
        yield given / "src" if (given / "src" / "metalmend").is_dir() else given
        return
    tree = workdir / f"before-{BEFORE}"
    git = ["git", "-C", str(REPOSITORY), "worktree"]
    subprocess.run([*git, "add", "--detach", str(tree), BEFORE], check=True, capture_output=True)
    try:
        yield tree / "src"
    finally:
        subprocess.run([*git, "remove", "--force", str(tree)], check=False, capture_output=True)


def ratio(before: float, after: float) -> str:
    if before == 0:
        return "-" if after == 0 else "new"
    return f"{after / before:.2f}x"


def report(before: Measurement, after: Measurement, hosts: int) -> None:
    def settled_text(m: Measurement) -> str:
        return "never quiet" if m.settled_after is None else f"quiet after {m.settled_after:.0f}s"

    print(
        f"metalmend at rest: {hosts} hosts ({after.redfish_hosts} Redfish, {after.ipmi_hosts}"
        f" IPMI), every lab controller, {after.seconds:.0f}s window once settled"
        f" ({before.label}: {settled_text(before)}; {after.label}: {settled_text(after)})"
    )
    print(f"  {'per host per minute':44} {before.label:>14} {after.label:>14}  after/before")
    b, a = before.figures(), after.figures()
    for row in b:
        print(f"  {row:44} {b[row]:14.2f} {a[row]:14.2f}  {ratio(b[row], a[row])}")
    print(
        f"  start-up until settled, per host ({before.startup_seconds:.0f}s,"
        f" {after.startup_seconds:.0f}s)"
    )
    b, a = before.startup_figures(), after.startup_figures()
    for row in b:
        print(f"  {row:44} {b[row]:14.2f} {a[row]:14.2f}  {ratio(b[row], a[row])}")
    print("  metalmend's API requests in the window (audit log), verb x resource:")
    for key in sorted(set(before.requests) | set(after.requests)):
        print(
            f"    {key[0]:>7} {key[1]:38} {before.requests[key]:8} {after.requests[key]:14}"
            f"  {ratio(before.requests[key], after.requests[key])}"
        )
    print("  apiserver_request_total in the window, every identity (the lab's kubelets too):")
    ours = ("secrets", "baremetalhosts", "baremetalhosts/status", "events", "machines",
            "metal3remediations", "metal3remediations/status", "machinehealthchecks/status")  # fmt: skip
    for resource in ours:
        for verbs, name in ((("GET", "LIST"), "reads"), (WRITES, "writes")):
            counts = [
                sum(n for (v, r), n in m.every_identity.items() if r == resource and v in verbs)
                for m in (before, after)
            ]
            if any(counts) or resource == "secrets":
                print(f"    {resource:30} {name:6} {counts[0]:8} {counts[1]:14}")


def main(source: Path | None = None, hosts: int = HOSTS, window: float = WINDOW) -> None:
    with tempfile.TemporaryDirectory(prefix="metalmend-bench-") as tmp:
        with before_tree(source, Path(tmp)) as src:
            before = measure(BEFORE, src, Path(tmp) / "before", hosts, window)
        after = measure("this tree", None, Path(tmp) / "after", hosts, window)
    report(before, after, hosts)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metalmend-src", type=Path, help="checkout to compare with")
    parser.add_argument("--hosts", type=int, default=HOSTS)
    parser.add_argument("--seconds", type=float, default=WINDOW)
    args = parser.parse_args()
    main(args.metalmend_src, args.hosts, args.seconds)
