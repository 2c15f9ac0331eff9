"""Sharding the hosts between replicas of ``metalmend run`` (docs/sharding.md).

Two modes.

``--simulate`` (pure functions, no cluster; seconds): the assignment of 20,000 hosts
(``--hosts``) by the consistent-hash ring of ``metalmend.policy.sharding`` at 4, 8 and 16
replicas, named as the chart's StatefulSet names its Pods (``metalmend-0`` ...):

- **balance**: the busiest replica's hosts over the mean, as a ratio (``1.07x``); the
  target is at most 1.15x at 4 and 8 replicas. The ring is the one the sharder of
  ``metalmend-0`` builds when it leads: itself at ``LEADER_WEIGHT`` of a share, so the
  others hold a little more than the mean by design; each replica's hosts over its fair
  share (its weight's part) is printed beside;
- **one added**: the share of hosts that move when one replica joins (ideally 1/(N+1);
  every moved host goes to the newcomer);
- **one removed**: the share that moves when one replica leaves (exactly its own hosts);
- the time to build the ring and to assign every host (what a sharder pays at each
  membership change).

Without ``--simulate`` (``--hosts N``, default 5,000; minutes to an hour): real replicas,
each ``metalmend run --leader-elect --shard --shard-id r<i>`` with every controller the lab
runs (lab.controller_argv, the production power poll of ``benchmarks.scale``, POLL s), as
separate processes against the lab of ``benchmarks.scale`` (``scale_lab``: the upstream
control plane with an audit log of metalmend's requests, N BareMetalHosts with Machines
and kwok Nodes, one ``lab.scalebmc`` process serving every host's Redfish BMC on a port of
its own). Every host's BMC journals its resets (``<host>.commands``) and names the process
that sent each (``journal_peers``), so that a power command is attributed to a replica.
In one run, in this order:

1. **1, 2 and 4 replicas** (r0; r1 added; r2 and r3 added): once every host is owned by
   the ring's choice (the ``shard.metalmend.dev/replica`` labels) and metalmend has made no
   write but its Lease renewals for QUIET s, each replica's CPU (utime+stime from /proc)
   over a WINDOW s window (a whole cycle of the Nodes' status heartbeats, which the
   leader alone watches; the count it received in the window is printed), as % of one
   core, and its ratio to 1/N of the one-replica figure (target: within 25 %), beside the
   replicas' CPU together, their resident memory, and a canary timed in the window
   (``canary_unit``: whether the machine itself ran slower); then REBOOTS
   hosts spread over the fleet each rebooted once through the reboot API (the
   annotation, ``benchmarks.shared.one_reboot``: request -> ``lastPoweredOn`` newer seen
   by a watcher), p50/p99 beside the one-replica figure.
2. **one replica added to 3** (r3): the share of the hosts whose owner changed (target at
   most 1/3, ideally 1/4), whether they all went to the newcomer; reboots asked, at the
   moment r3 holds its Lease, of up to JOIN_REBOOTS hosts the ring moves to it, so that
   drains and reboots overlap.
3. **balance at 4** replicas, from the labels: the busiest replica's hosts over the mean,
   and over its fair share (the leader lighter on the ring).
4. **kill -9 of one of 4 replicas**, ``--trials`` times: a replica that does not lead, in
   turn; right after the kill, reboots asked of TRIAL_REBOOTS of its hosts; kill ->
   reboot served (the BMC journals power off, then on) per host, p50/p99 against the
   target Lease duration + 5 s; then the replica is started again under its name and the
   run waits until it holds its share again. Then ``--leader-trials`` times the same with
   the leader as the victim: the sharder dies with it, so its hosts wait for another
   replica to take the leader Lease (its expiry) and then reassign them; reported on a
   line of its own against the same target.
5. **balance at 8** replicas (r4 to r7 added).
6. **hosts served by two replicas at once, or twice**: every BMC journal of the run
   against the reboots asked of that host: a host is counted when it got more or fewer
   commands than the reboots asked (a reboot served twice, or not at all), or when one
   of its reboots got its power-off from one replica and its power-on from another
   without the first having logged ``host handed over`` for it in between (its log's
   time, written once the label's removal was stored). A reboot handed over in between,
   each command once and in that order, is the drain working: counted apart. Printed for
   the join and for the whole run.

Every wait is bounded and says what it waited for when it gives up; every server is on
127.0.0.1 (the BMCs and the control plane bind port 0, a replica's health port is a free
port); every process is stopped on the way out. Prints numbers; asserts nothing.

Run: ``python -m benchmarks.sharding --hosts 5000`` (``--trials``, ``--window``,
``--reboots`` to shorten it); ``python -m benchmarks.sharding --simulate``. Needs kwok
(``make kwok``). Not part of the test suite, nor of ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import httpx
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.types import PatchType

from benchmarks.at_rest import AUDIT_WRITES
from benchmarks.scale import (
    POLL,
    QUIET,
    ScaleLab,
    cpu_seconds,
    listing,
    memory_mib,
    scale_lab,
    wait_for,
)
from benchmarks.scale import (
    WINDOW as SCALE_WINDOW,
)
from benchmarks.shared import journal, one_reboot
from metalmend.api import names as api_names
from metalmend.api.resources import BareMetalHost
from metalmend.kube.leader import LeaseTiming
from metalmend.policy.sharding import (
    LEADER_WEIGHT,
    balance,
    loads,
    moves,
    placement,
    weighted_balance,
)
from metalmend_lab import lab
from metalmend_lab.controlplane import LOOPBACK, free_port
from metalmend_lab.hosts import NAMESPACE

HOSTS = 20_000
REPLICAS = (4, 8, 16)

REAL_HOSTS = 5_000
COUNTS = (1, 2, 4)  # replicas whose CPU at rest and reboot latency are measured
TRIALS = 20
LEADER_TRIALS = 5  # kill -9 of the leader itself (the sharder moves with it)
TRIAL_REBOOTS = 3  # reboots asked of the killed replica's hosts in each trial
JOIN_REBOOTS = 50
REBOOTS = 200  # a p99 of 50 samples is their slowest: one stall decided it in earlier runs
# The CPU window at rest holds a whole cycle of the Nodes' status heartbeats (320 s, as
# benchmarks.scale's window; a kubelet's is 5 minutes), and the lab spreads the heartbeats
# over the cycle (``scale_lab(heartbeats_spread=True)``). Before, kwok's Nodes, initialised
# together, heartbeated in waves (5,000 events within a minute or so, then none for
# minutes), and the 120 s window held a wave in some runs and not in others: the leader,
# which alone watches the Nodes (and before ea2a1e1 every replica), paid it or not, and a
# reboot asked during a wave waited for a machine busy with it.
WINDOW = SCALE_WINDOW
CANARY_EVERY = 1.0  # s between two units of the canary in a CPU window
LEASE = LeaseTiming().lease_duration  # the shard Leases' duration (s)
FAILOVER_TARGET = LEASE + 5.0
SETTLE = 1800.0  # every host owned by the ring's choice (the first start reads every BMC)
QUIET_WITHIN = 300.0  # metalmend quiet (no write but Lease renewals) after that
SERVED_WITHIN = 180.0  # a reboot asked -> served at the BMC
READY_WITHIN = 120.0  # a replica started -> /readyz (it holds its shard Lease)
HOSTS_PATH = f"/apis/metal3.io/v1alpha1/namespaces/{NAMESPACE}/baremetalhosts"


# ---- the summaries: pure --------------------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One reset as a BMC journalled it: when, what (``hard off``, ``on``...) and who
    sent it (a replica's name; ``?`` when the BMC could not tell)."""

    at: float
    word: str
    by: str


def parse_journal(text: str, replicas_by_pid: Mapping[int, str]) -> list[Command]:
    """lab.scalebmc's journal lines, ``<unix time> <word>[ pid=<pid>]``."""
    commands = []
    for line in text.splitlines():
        stamp, _, rest = line.partition(" ")
        word, _, sender = rest.partition(" pid=")
        by = replicas_by_pid.get(int(sender), "?") if sender.isdigit() else "?"
        commands.append(Command(float(stamp), word, by))
    return commands


def is_off(word: str) -> bool:
    return word.endswith(" off")


def served_twice_or_by_two(
    commands: list[Command], asked: int, handed: Mapping[str, list[float]] | None = None
) -> str | None:
    """Why a host's journal is not ``asked`` reboots each served once (one power-off, then
    one power-on), each by one replica at a time; None when it is. A reboot whose power-off
    came from one replica and power-on from another is a hand-over, not two at once, only
    when the first replica let the host go in between: ``handed`` has, per replica, the
    times it logged ``host handed over`` for this host, written after the label's removal
    was stored, so a time before the power-on proves the order. A sender the BMC could not
    name (``?``) counts as no one."""
    expected = ["off", "on"] * asked
    seen = ["off" if is_off(c.word) else c.word for c in commands]
    if seen != expected:
        return f"{asked} reboot(s) asked, the BMC got {' '.join(c.word for c in commands)!r}"
    for off, on in zip(commands[::2], commands[1::2], strict=True):
        if handed_over_between(off, on, handed or {}) is False:
            return (
                f"one reboot served by {off.by} and {on.by}, with no hand-over by {off.by}"
                " between its power-off and the power-on"
            )
    return None


def handed_over_between(
    off: Command, on: Command, handed: Mapping[str, list[float]]
) -> bool | None:
    """None: one replica (or an unnamed one) sent both; True: two, and the first let the
    host go between them; False: two, and nothing says the first had let go."""
    if len({off.by, on.by} - {"?"}) < 2:
        return None
    return any(off.at <= at <= on.at for at in handed.get(off.by, ()))


def handed_mid_reboot(commands: list[Command], handed: Mapping[str, list[float]]) -> bool:
    """Whether one of the host's reboots was handed over between its power-off and on."""
    pairs = zip(commands[::2], commands[1::2], strict=False)
    return any(handed_over_between(off, on, handed) for off, on in pairs)


HANDED_OVER = re.compile(
    r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{3}) INFO \S+: host handed over host=(\S+)"
)


def handovers_in(log: str) -> dict[str, list[float]]:
    """A replica's ``host handed over`` lines: ``namespace/name`` -> unix times (its log's
    local time, milliseconds)."""
    found: dict[str, list[float]] = {}
    for line in log.splitlines():
        match = HANDED_OVER.match(line)
        if match is not None:
            stamp, millis, key = match.groups()
            at = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + int(millis) / 1000
            found.setdefault(key, []).append(at)
    return found


def moved_hosts(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> set[str]:
    """The hosts whose owner differs (a host absent from one side counts as unowned)."""
    return {h for h in before.keys() | after.keys() if before.get(h) != after.get(h)}


def shares(owners: Mapping[str, str | None], replicas: Iterable[str]) -> dict[str, int]:
    """Hosts per replica (every replica listed, zeros included; unowned hosts left out)."""
    counts = Counter(o for o in owners.values() if o is not None)
    return {r: counts.get(r, 0) for r in replicas}


def cpu_ratios(per_replica: Mapping[str, float], one: float) -> dict[str, float]:
    """Each replica's CPU over 1/N of the one-replica figure (1.0: exactly its share)."""
    share = one / len(per_replica) if per_replica else 0.0
    return {r: (cpu / share if share else float("nan")) for r, cpu in per_replica.items()}


def canary_unit() -> None:
    """A fixed unit of work, of the kinds a replica's read is made of (Python objects and
    calls, JSON, a hash in C: 2.5 ms on the machine of docs/sharding.md): its CPU time is
    the machine's price of CPU at that moment. Timed during each CPU window, it says
    whether the same work runs slower when more processes share the cores, apart from what
    the replicas do. Short and started after a second asleep, it begins with cold caches
    in every phase: it cannot see what a busy process gains from keeping its own warm."""
    document = {f"key-{i}": {"state": "On", "seq": i, "tags": ["a", "b"]} for i in range(300)}
    for _ in range(4):
        text = json.dumps(document)
        assert json.loads(text) == document
        hashlib.sha256(text.encode() * 16).digest()
        sum(i * len(key) for i, key in enumerate(document))


def canary_ms(unit: Callable[[], None] = canary_unit) -> float:
    """CPU time of one ``unit`` in this thread (ms)."""
    began = time.thread_time()
    unit()
    return (time.thread_time() - began) * 1000


def p99(values: list[float]) -> float:
    """The 99th percentile, interpolated between the samples (never beyond the largest:
    with 60 samples, the exclusive method would extrapolate past it)."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[98]


NODE_EVENTS = 'metalmend_informer_events_total{resource="nodes",type="MODIFIED"}'


def node_events(metrics: str) -> float:
    """The count of Node MODIFIED watch events in a replica's /metrics text (0: it does not
    watch the Nodes)."""
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name == NODE_EVENTS:
            return float(value)
    return 0.0


def counts_shares(metrics: str) -> bool:
    """Whether a replica's /metrics text has a sample of metalmend_shard_replicas_live:
    only the leader's sharder gives one. Every replica declares the metric (its HELP and
    TYPE lines), so the name alone says nothing."""
    return any(
        line.split(" ", 1)[0] == "metalmend_shard_replicas_live" for line in metrics.splitlines()
    )


def met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---- the replicas ---------------------------------------------------------------------------


@dataclass
class Replica:
    name: str
    port: int
    process: subprocess.Popen[bytes]


class Fleet:
    """The replicas, each a `metalmend run` process with its log in a file; every process
    ever started is remembered by pid (a BMC journal names the sender's pid)."""

    def __init__(self, scale: ScaleLab, workdir: Path) -> None:
        self.scale, self.workdir = scale, workdir
        self.replicas: dict[str, Replica] = {}
        self.by_pid: dict[int, str] = {}
        self.killed: set[str] = set()  # killed on purpose, not started again yet
        self.exits: list[str] = []  # replicas that exited on their own, and why

    def start(self, name: str) -> Replica:
        port = free_port()
        argv = lab.controller_argv(
            self.scale.kubeconfig, self.scale.plane.ca.pair.cert, lab.DEFAULT_CONTROLLERS,
            port, 30.0,
        )  # fmt: skip
        argv += ["--power-poll-interval", f"{POLL:g}",  # the last flag wins
                 "--leader-elect", "--leader-election-namespace", NAMESPACE,
                 "--shard", "--shard-id", name]  # fmt: skip
        with (self.workdir / f"{name}.log").open("ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        replica = Replica(name, port, process)
        self.replicas[name] = replica
        self.by_pid[process.pid] = name
        self.killed.discard(name)
        return replica

    def live(self) -> list[str]:
        """The replicas that should run: every one started, but those killed on purpose."""
        return sorted(n for n in self.replicas if n not in self.killed)

    def alive(self) -> bool:
        """Whether the BMCs run. A replica not killed on purpose that exited (it could not
        renew its Lease in time: it exits so that a fresh process stands again) is started
        again under its name, as its StatefulSet would, and counted in ``exits``."""
        for name in self.live():
            process = self.replicas[name].process
            if process.poll() is not None:
                log = (self.workdir / f"{name}.log").read_text(errors="replace")
                last = (log.strip().splitlines() or ["(no output)"])[-1][:160]
                self.exits.append(f"{name} (exit {process.returncode}: {last})")
                print(f"  {name} exited on its own ({last}); started again", flush=True)
                self.start(name)
        return self.scale.bmcs.running()

    def wait_ready(self, replica: Replica) -> None:
        def ready() -> bool:
            try:
                url = f"http://{LOOPBACK}:{self.replicas[replica.name].port}/readyz"
                return httpx.get(url, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(
            ready, READY_WITHIN, 0.2,
            f"replica {replica.name} ready (/readyz: caches synced, its shard Lease held;"
            f" log {self.workdir / replica.name}.log)", self.alive,
        )  # fmt: skip

    def metrics(self, name: str) -> str | None:
        """The replica's /metrics text (None when it does not answer)."""
        url = f"http://{LOOPBACK}:{self.replicas[name].port}/metrics"
        try:
            return httpx.get(url, timeout=10).text
        except httpx.HTTPError:
            return None

    def leader(self) -> str | None:
        """The replica whose /metrics counts the shares (the leader runs the sharder)."""
        for name in self.live():
            text = self.metrics(name)
            if text is not None and counts_shares(text):
                return name
        return None

    def node_events(self, name: str | None) -> float:
        """Node changes (watch events MODIFIED) the replica ``name`` has received so far:
        the leader's count, of Nodes' heartbeats at rest (nan without a leader)."""
        text = None if name is None else self.metrics(name)
        return float("nan") if text is None else node_events(text)

    def kill(self, name: str) -> float:
        """SIGKILL; the moment it is dead."""
        process = self.replicas[name].process
        self.killed.add(name)
        process.send_signal(signal.SIGKILL)
        process.wait(30)
        return time.time()

    def stop_all(self) -> None:
        for replica in self.replicas.values():
            if replica.process.poll() is None:
                replica.process.terminate()
        for replica in self.replicas.values():
            try:
                replica.process.wait(30)
            except subprocess.TimeoutExpired:
                replica.process.kill()
                replica.process.wait(10)


def owners(scale: ScaleLab) -> dict[str, str | None]:
    """Each host's owner from its labels (None: unowned, or draining)."""
    found: dict[str, str | None] = {}
    for host in listing(scale.plane, HOSTS_PATH):
        labels = host["metadata"].get("labels") or {}
        owner = labels.get(api_names.SHARD_REPLICA_LABEL)
        draining = api_names.SHARD_DRAIN_LABEL in labels
        found[host["metadata"]["name"]] = None if draining else owner
    return found


def ring_choice(hosts: list[str], live: list[str], leader: str | None) -> dict[str, str | None]:
    """Each host's owner as the sharder of ``leader`` assigns it (itself lighter)."""
    ring = placement(live, leader)
    return {h: ring.owner(f"{NAMESPACE}/{h}") for h in hosts}


class AuditTail:
    """metalmend's last write (its Lease renewals left out) from the audit log, read on
    from where it stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.last = path, 0, 0.0

    def last_write(self) -> float:
        with self.path.open("rb") as log:
            log.seek(self.offset)
            chunk = log.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        for line in complete.splitlines():
            with contextlib.suppress(ValueError, KeyError):
                event = json.loads(line)
                resource = (event.get("objectRef") or {}).get("resource")
                if event["verb"] in AUDIT_WRITES and resource != "leases":
                    stamp = datetime.fromisoformat(event["requestReceivedTimestamp"])
                    self.last = max(self.last, stamp.timestamp())
        return self.last


class Bench:
    def __init__(self, scale: ScaleLab, workdir: Path, fleet: Fleet, args: argparse.Namespace):
        self.scale, self.workdir, self.fleet, self.args = scale, workdir, fleet, args
        self.hosts = scale.names
        self.audit = AuditTail(scale.audit)
        self.asked: Counter[str] = Counter()  # reboots asked, per host, over the run
        self.client = Client(KubeConfig.from_file(scale.plane.kubeconfig))

    def say(self, line: str) -> None:
        print(line, flush=True)

    def settle(self, what: str) -> None:
        """Every host owned by the ring's choice of the live replicas, then metalmend quiet
        (no write but Lease renewals) for QUIET s."""
        live = self.fleet.live()
        began = time.time()
        wait_for(
            lambda: self.fleet.leader() is not None, SETTLE, 1.0,
            f"{what}: a leader among {','.join(live)} (its /metrics counting the shares)",
            self.fleet.alive,
        )  # fmt: skip
        wanted = ring_choice(self.hosts, live, self.fleet.leader())
        wait_for(
            lambda: owners(self.scale) == wanted, SETTLE, 1.0,
            f"{what}: every host labelled for the ring's choice of {','.join(live)}",
            self.fleet.alive,
        )  # fmt: skip
        owned = time.time()

        def quiet() -> bool:
            return time.time() - max(self.audit.last_write(), owned) >= QUIET

        wait_for(
            quiet, QUIET_WITHIN, 1.0,
            f"{what}: metalmend quiet ({QUIET:g} s without a write but Lease renewals)",
            self.fleet.alive,
        )  # fmt: skip
        self.say(
            f"  {what}: every host owned by the ring's choice {owned - began:.0f}s after,"
            f" quiet {time.time() - owned:.0f}s later"
        )

    def cpu_at_rest(self) -> AtRest:
        """Each live replica's CPU over the window, % of one core; the canary's median
        CPU time over the window (ms; ``canary_unit``, once every CANARY_EVERY s); each
        replica's resident memory at the window's end (MiB); and the Node heartbeats the
        leader received in the window."""
        for _ in range(3):
            self.fleet.alive()
            exits = len(self.fleet.exits)
            pids = {n: self.fleet.replicas[n].process.pid for n in self.fleet.live()}
            leader = self.fleet.leader()
            nodes = self.fleet.node_events(leader)
            waited = Contention.now(pids)
            before, began = {n: cpu_seconds(p) for n, p in pids.items()}, time.monotonic()
            canary = []
            while (left := began + self.args.window - time.monotonic()) > 0:
                canary.append(canary_ms())
                time.sleep(min(CANARY_EVERY, left))
            seconds = time.monotonic() - began
            if all(self.fleet.replicas[n].process.poll() is None for n in pids):
                used = {n: 100 * (cpu_seconds(p) - before[n]) / seconds for n, p in pids.items()}
                resident = {n: memory_mib(p)[0] for n, p in pids.items()}
                heartbeats = self.fleet.node_events(leader) - nodes
                contention = waited.until(Contention.now(pids))
                return AtRest(used, statistics.median(canary), resident, heartbeats, contention)
            self.fleet.alive()  # started again: once settled, the window again
            self.settle("after a replica exited during the CPU window")
            if len(self.fleet.exits) == exits:
                break
        raise RuntimeError("a CPU window without a replica exiting on its own (3 tries)")

    def sample(self) -> list[str]:
        step = max(1, len(self.hosts) // self.args.reboots)
        return self.hosts[::step][: self.args.reboots]

    def reboot_sample(self) -> list[tuple[str, float, float, float]]:
        """One reboot of each sampled host in turn: the host, request -> off at the BMC,
        BMC on -> status seen, request -> status seen (ms)."""

        async def run() -> list[tuple[str, float, float, float]]:
            client = AsyncClient(KubeConfig.from_file(self.scale.plane.kubeconfig))
            took = []
            try:
                for host in self.sample():
                    self.asked[host] += 1
                    commands = self.workdir / f"{host}.commands"
                    off, seen, total = await asyncio.wait_for(
                        one_reboot(client, host, commands), SERVED_WITHIN
                    )
                    took.append((host, off, seen, total))
            finally:
                await client.close()
            return took

        try:
            return asyncio.run(run())
        except TimeoutError as error:
            raise TimeoutError(
                f"a reboot served (status seen) within {SERVED_WITHIN:g}s"
            ) from error

    def ask_reboot(self, host: str) -> None:
        self.asked[host] += 1
        self.client.patch(
            BareMetalHost, host, {"metadata": {"annotations": {api_names.REBOOT: '{"mode":"hard"}'}}},
            namespace=NAMESPACE, patch_type=PatchType.MERGE,
        )  # fmt: skip

    def served_at(self, host: str, since: float) -> float | None:
        """When the BMC powered ``host`` on after a power-off at or after ``since``."""
        path = self.workdir / f"{host}.commands"
        off = journal(path, since, "hard off")
        return journal(path, off, "on") if off is not None else None

    def wait_served(self, hosts: list[str], since: float, what: str) -> dict[str, float]:
        wait_for(
            lambda: all(self.served_at(h, since) is not None for h in hosts),
            SERVED_WITHIN, 0.2, f"{what}: the BMCs of {','.join(hosts)} powered off then on",
            self.fleet.alive,
        )  # fmt: skip
        return {h: self.served_at(h, since) or 0.0 for h in hosts}

    def commands(self, host: str) -> list[Command]:
        path = self.workdir / f"{host}.commands"
        text = path.read_text() if path.exists() else ""
        return parse_journal(text, self.fleet.by_pid)

    def handovers(self) -> dict[str, dict[str, list[float]]]:
        """``host`` -> replica -> when it logged handing the host over, from every log."""
        found: dict[str, dict[str, list[float]]] = {}
        for log in self.workdir.glob("r*.log"):
            for key, times in handovers_in(log.read_text(errors="replace")).items():
                namespace, _, host = key.partition("/")
                if namespace == NAMESPACE:
                    found.setdefault(host, {})[log.stem] = times
        return found

    def doubly_served(self, hosts: Iterable[str]) -> tuple[dict[str, str], set[str]]:
        """The hosts served twice or by two replicas at once (why), and those whose reboot
        was handed over between its power-off and its power-on (each command once)."""
        found, handed, every = {}, set(), self.handovers()
        for host in hosts:
            commands = self.commands(host)
            why = served_twice_or_by_two(commands, self.asked[host], every.get(host))
            if why is not None:
                found[host] = why
            elif handed_mid_reboot(commands, every.get(host, {})):
                handed.add(host)
        return found, handed

    def senders(self, hosts: Iterable[str]) -> Counter[str]:
        """The journalled power commands of ``hosts`` by sender (``?``: not named)."""
        return Counter(c.by for host in hosts for c in self.commands(host))


# ---- the phases -----------------------------------------------------------------------------


def cpu_pressure_us(text: str | None = None) -> float | None:
    """The kernel's CPU pressure, ``some`` total (µs during which at least one runnable
    task waited for a core; /proc/pressure/cpu, PSI); None where the kernel has none."""
    if text is None:
        try:
            text = Path("/proc/pressure/cpu").read_text()
        except OSError:
            return None
    for line in text.splitlines():
        if line.startswith("some "):
            fields_ = dict(kv.split("=", 1) for kv in line.split()[1:])
            return float(fields_["total"])
    return None


def runqueue_wait_s(pid: int) -> float:
    """Seconds the process's threads have spent runnable but waiting for a core
    (/proc/<pid>/task/*/schedstat, its second field, ns)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            total += int(stat.read_text().split()[1])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total / 1e9


@dataclass(frozen=True)
class Contention:
    """What waiting for a core cost while something ran: the share of the time some task
    on the machine waited (PSI), and each replica's own wait per second."""

    at: float  # monotonic
    pressure: float | None  # µs, cpu_pressure_us
    waits: dict[str, float]  # replica -> s, runqueue_wait_s

    @classmethod
    def now(cls, pids: Mapping[str, int]) -> Contention:
        waits = {n: runqueue_wait_s(p) for n, p in pids.items()}
        return cls(time.monotonic(), cpu_pressure_us(), waits)

    def until(self, later: Contention) -> str:
        seconds = max(later.at - self.at, 1e-9)
        if self.pressure is None or later.pressure is None:
            pressure = "CPU pressure: the kernel has no PSI"
        else:
            share = (later.pressure - self.pressure) / 1e6 / seconds
            pressure = f"some task waited for a core {share:.0%} of the time (PSI)"
        waits = ", ".join(
            f"{n} {1000 * (later.waits[n] - self.waits[n]) / seconds:.0f}"
            for n in sorted(self.waits)
            if n in later.waits
        )
        return f"{pressure}; each replica's wait for a core, ms a second: {waits}"


class AtRest(NamedTuple):
    cpu: dict[str, float]  # name -> % of a core
    canary: float  # ms
    resident: dict[str, float]  # name -> MiB
    node_events: float  # Node heartbeats the leader received in the window
    contention: str = ""  # waits for a core in the window (Contention.until)


@dataclass(frozen=True)
class Balance:
    """Hosts per replica, the leader lighter on the ring (``LEADER_WEIGHT``): the busiest
    replica's hosts over the mean (the target: at most 1.15x) and over its own fair share,
    its weight's part of all hosts (what the ring aims at)."""

    counts: dict[str, int]
    leader: str | None
    of_mean: float
    of_share: float

    @classmethod
    def of(cls, counts: dict[str, int], leader: str | None) -> Balance:
        weights = {leader: LEADER_WEIGHT} if leader in counts else {}
        return cls(counts, leader, balance(counts), weighted_balance(counts, weights))

    def says(self, hosts: int) -> str:
        mean = hosts / len(self.counts) if self.counts else 0.0
        lighter = (
            f"; the leader {self.leader} at {LEADER_WEIGHT:g} of a share holds"
            f" {self.counts[self.leader]}"
            if self.leader in self.counts
            else ""
        )
        return (
            f"the busiest holds {self.of_mean:.2f}x the mean"
            f" ({min(self.counts.values(), default=0)}..{max(self.counts.values(), default=0)}"
            f" hosts, mean {mean:.0f}), {self.of_share:.2f}x its fair share{lighter}"
        )


@dataclass
class Results:
    cpu: dict[int, dict[str, float]] = field(default_factory=dict)  # replicas -> name -> %
    canary: dict[int, float] = field(default_factory=dict)  # replicas -> the canary's ms
    memory: dict[int, dict[str, float]] = field(default_factory=dict)  # -> name -> RSS MiB
    node_events: dict[int, float] = field(default_factory=dict)  # -> heartbeats in the window
    leaders: dict[int, str | None] = field(default_factory=dict)
    reboots: dict[int, list[float]] = field(default_factory=dict)  # replicas -> ms
    slowest: dict[int, str] = field(default_factory=dict)  # replicas -> its slowest reboot
    phases: dict[int, str] = field(default_factory=dict)  # replicas -> where the time went
    contention: dict[int, str] = field(default_factory=dict)  # replicas -> waits for a core
    moved: set[str] = field(default_factory=set)
    moved_to: set[str | None] = field(default_factory=set)
    join_asked: list[str] = field(default_factory=list)
    join_double: dict[str, str] = field(default_factory=dict)
    join_handed: set[str] = field(default_factory=set)  # handed over between off and on
    balance: dict[int, Balance] = field(default_factory=dict)
    failover: list[float] = field(default_factory=list)  # kill -> served, s
    trials: list[tuple[str, float]] = field(default_factory=list)  # victim, slowest
    leader_failover: list[float] = field(default_factory=list)  # the leader killed: s
    leader_trials: list[tuple[str, float]] = field(default_factory=list)
    run_double: dict[str, str] = field(default_factory=dict)
    run_handed: set[str] = field(default_factory=set)
    run_asked: int = 0  # reboots asked over the run
    senders: Counter[str] = field(default_factory=Counter)  # journalled commands by sender
    exits: list[str] = field(default_factory=list)  # replicas that exited on their own


def at_rest(bench: Bench, results: Results, count: int) -> None:
    results.leaders[count] = bench.fleet.leader()
    rest = bench.cpu_at_rest()
    results.cpu[count], results.canary[count] = rest.cpu, rest.canary
    results.memory[count], results.node_events[count] = rest.resident, rest.node_events
    cpu = results.cpu[count]
    bench.say(f"  {count} replica(s): CPU at rest " + ", ".join(
        f"{n} {v:.1f}%" for n, v in sorted(cpu.items()))
        + f"; the canary {results.canary[count]:.2f} ms; resident " + ", ".join(
        f"{n} {v:.0f} MiB" for n, v in sorted(results.memory[count].items()))
        + f"; Node heartbeats in the window {rest.node_events:.0f}")  # fmt: skip
    pids = {n: bench.fleet.replicas[n].process.pid for n in bench.fleet.live()}
    before = Contention.now(pids)
    sampled = bench.reboot_sample()
    results.contention[count] = before.until(Contention.now(pids))
    results.reboots[count] = ms = [total for _, _, _, total in sampled]
    host, off, seen, total = max(sampled, key=lambda one: one[3])
    held = owners(bench.scale)
    owner = held.get(host) or "none"
    results.phases[count] = phases(sampled, held, results.leaders[count])
    results.slowest[count] = (
        f"{host} (owner {owner}): request -> off at the BMC {off:.0f} ms,"
        f" BMC on -> status seen {seen:.0f} ms, in all {total:.0f} ms"
    )
    bench.say(
        f"  {count} replica(s): {len(ms)} reboots, p50 {p50(ms):.0f} ms, p99 {p99(ms):.0f} ms;"
        f" the slowest {results.slowest[count]}"
    )
    bench.say(f"  {count} replica(s): {results.phases[count]}")
    bench.say(f"  {count} replica(s), in the CPU window: {rest.contention}")
    bench.say(f"  {count} replica(s), while the reboots ran: {results.contention[count]}")


def phases(
    sampled: list[tuple[str, float, float, float]],
    held: Mapping[str, str | None],
    leader: str | None,
) -> str:
    """Where a reboot's time went, p50/p99 of each part over the sample: request -> off at
    the BMC (the watch event, the owner's reconcile, the command), off -> on (the owner's
    reads until the BMC says off, then the power-on), on -> status seen (the read that sees
    it on, the status write, the watch event); and the p99 of the whole apart for the
    leader's hosts and the others'."""
    parts = {
        "request -> off": [off for _, off, _, _ in sampled],
        "off -> on": [total - off - seen for _, off, seen, total in sampled],
        "on -> status seen": [seen for _, _, seen, _ in sampled],
    }
    said = [f"{name} p50 {p50(ms):.0f} / p99 {p99(ms):.0f} ms" for name, ms in parts.items()]
    if leader is not None:
        led = [total for host, _, _, total in sampled if held.get(host) == leader]
        rest = [total for host, _, _, total in sampled if held.get(host) != leader]
        said.append(
            f"p99 of the leader's hosts {p99(led):.0f} ms ({len(led)}),"
            f" of the others' {p99(rest):.0f} ms ({len(rest)})"
        )
    return "; ".join(said)


def join(bench: Bench, results: Results) -> None:
    """r3 added to r0..r2: reboots asked of hosts it takes as soon as it holds its Lease."""
    before = owners(bench.scale)
    three, four = bench.fleet.live(), [*bench.fleet.live(), "r3"]
    leader = bench.fleet.leader()
    keys = [f"{NAMESPACE}/{h}" for h in bench.hosts]
    moving = sorted(moves(placement(three, leader), placement(four, leader), keys))
    asked = [key.split("/", 1)[1] for key in moving][: bench.args.join_reboots]
    replica = bench.fleet.start("r3")
    bench.fleet.wait_ready(replica)
    since = time.time()
    for host in asked:
        bench.ask_reboot(host)
    bench.wait_served(asked, since, "reboots asked while r3 joined")
    bench.settle("4 replicas (r3 joined)")
    after = owners(bench.scale)
    results.moved = moved_hosts(before, after)
    results.moved_to = {after[h] for h in results.moved}
    results.join_asked = asked
    results.join_double, results.join_handed = bench.doubly_served(asked)


def failover(bench: Bench, results: Results) -> None:
    for trial in range(bench.args.trials):
        leader = bench.fleet.leader()
        victims = [n for n in bench.fleet.live() if n != leader]
        took = kill_trial(bench, trial, victims[trial % len(victims)])
        results.failover += took
        results.trials.append((victims[trial % len(victims)], max(took, default=0.0)))
    for trial in range(bench.args.leader_trials):
        leader = bench.fleet.leader()
        if leader is None:
            raise RuntimeError("no replica counts the shares on /metrics: no leader to kill")
        took = kill_trial(bench, trial, leader, "the leader")
        results.leader_failover += took
        results.leader_trials.append((leader, max(took, default=0.0)))


def kill_trial(bench: Bench, trial: int, victim: str, role: str = "") -> list[float]:
    """kill -9 ``victim``, reboots asked of TRIAL_REBOOTS of its hosts at once: kill ->
    each reboot served (s); then the victim started again and the fleet settled."""
    theirs = sorted(h for h, o in owners(bench.scale).items() if o == victim)
    start = (trial * TRIAL_REBOOTS) % max(1, len(theirs))
    chosen = (theirs[start:] + theirs[:start])[:TRIAL_REBOOTS]
    what = f"{victim} ({role})" if role else victim
    killed = bench.fleet.kill(victim)
    for host in chosen:
        bench.ask_reboot(host)
    served = bench.wait_served(chosen, killed, f"trial {trial + 1}: {what} killed")
    took = [at - killed for at in served.values()]
    bench.say(f"  trial {trial + 1}: kill -9 {what}, {len(chosen)} of its hosts rebooted,"
              f" served {min(took, default=0):.1f}..{max(took, default=0):.1f}s after")  # fmt: skip
    bench.fleet.wait_ready(bench.fleet.start(victim))
    bench.settle(f"trial {trial + 1}: {victim} back")
    return took


def measure(hosts: int, workdir: Path, args: argparse.Namespace) -> Results:
    results = Results()
    with contextlib.ExitStack() as stack:
        scale = stack.enter_context(
            scale_lab(hosts, workdir, journal=[f"worker-{i}" for i in range(hosts)],
                      journal_peers=True, heartbeats_spread=True)
        )  # fmt: skip
        fleet = Fleet(scale, workdir)
        stack.callback(fleet.stop_all)
        bench = Bench(scale, workdir, fleet, args)
        for count in COUNTS:  # 1, 2, 4 (r3 joins from 3: the move measured)
            while len(fleet.live()) < min(count, 3):
                fleet.wait_ready(fleet.start(f"r{len(fleet.live())}"))
            if count == 4:
                bench.settle("3 replicas")
                join(bench, results)
            else:
                bench.settle(f"{count} replica(s)")
            at_rest(bench, results, count)
        results.balance[4] = Balance.of(shares(owners(scale), fleet.live()), fleet.leader())
        failover(bench, results)
        for i in range(4, 8):
            fleet.wait_ready(fleet.start(f"r{i}"))
        bench.settle("8 replicas")
        results.balance[8] = Balance.of(shares(owners(scale), fleet.live()), fleet.leader())
        results.run_double, results.run_handed = bench.doubly_served(bench.asked)
        results.run_asked = sum(bench.asked.values())
        results.senders = bench.senders(bench.asked)
        results.exits = fleet.exits
    return results


# ---- the report -----------------------------------------------------------------------------


def report(hosts: int, results: Results, args: argparse.Namespace) -> list[str]:
    one = results.cpu[1]["r0"] if 1 in results.cpu else float("nan")
    lines = [
        f"sharding, measured: {hosts:,} hosts (kwok Nodes, lab.scalebmc Redfish BMCs), real"
        f" replicas of `metalmend run --shard`, every lab controller, poll {POLL:g}s,"
        f" {args.window:g}s CPU window",
        f"  {'replicas':>8}  {'CPU per replica at rest, % of a core (x 1/N of one)':<58}"
        f"  {'reboot p50 / p99 (ms)':>22}",
    ]
    for count, cpu in sorted(results.cpu.items()):
        ratios = cpu_ratios(cpu, one)
        leader = results.leaders.get(count)
        cells = ", ".join(
            f"{n}{'*' if n == leader else ''} {v:.1f} ({ratios[n]:.2f}x)"
            for n, v in sorted(cpu.items())
        )
        ms = results.reboots.get(count, [])
        lines.append(f"  {count:>8}  {cells:<58}  {p50(ms):>9.0f} / {p99(ms):.0f}")
    lines.append("  (* the leader: it also runs the sharder and the leader-elected controllers)")
    if results.node_events:
        lines.append(
            "Node heartbeats the leader received in each CPU window (a whole heartbeat cycle):"
            + ", ".join(f" {n:.0f} at {c}" for c, n in sorted(results.node_events.items()))
        )
    for count, cpu in sorted(results.cpu.items()):
        if count == 1:
            lines.append(f"CPU at rest, 1 replica: {one:.1f} % of a core")
            continue
        ratios = cpu_ratios(cpu, one)
        within = sum(0.75 <= r <= 1.25 for r in ratios.values())
        lines.append(
            f"CPU at rest, {count} replicas: "
            + ", ".join(f"{n} {v:.1f} %" for n, v in sorted(cpu.items()))
            + f" of a core; 1/{count} of one replica's is {one / count:.1f} %; ratios "
            + ", ".join(f"{ratios[n]:.2f}x" for n in sorted(cpu))
            + f" ({within} of {count} within 25 %, the target)"
        )
    lines += together(results)
    lines += memory(results)
    base = p99(results.reboots.get(1, []))
    for count, ms in sorted(results.reboots.items()):
        lines.append(
            f"reboot p99 at {count} replica(s): {p99(ms):.0f} ms beside {base:.0f} ms at one"
            f" replica ({p99(ms) / base:.2f}x; {len(ms)} hosts, one reboot each); the slowest"
            f" {results.slowest.get(count, '?')}"
        )
        if count in results.phases:
            lines.append(f"  where the time went at {count}: {results.phases[count]}")
        if count in results.contention:
            lines.append(f"  while they ran at {count}: {results.contention[count]}")
    if not results.trials:
        lines.append(
            "failover, kill -9 of one of 4 replicas (not the leader): not run (--trials 0)"
        )
    else:
        lines.append(
            f"failover, kill -9 of one of 4 replicas (not the leader), {len(results.trials)}"
            f" trials, {len(results.failover)} reboots asked right after the kill: kill ->"
            f" reboot served (BMC: power off, then on) p50 {p50(results.failover):.1f} s, p99"
            f" {p99(results.failover):.1f} s (target <= Lease {LEASE:g} s + 5 s ="
            f" {FAILOVER_TARGET:g} s: {met(p99(results.failover) <= FAILOVER_TARGET)})"
        )
    if results.leader_trials:
        lines.append(
            f"failover of the leader itself (the sharder dies with it), kill -9, "
            f"{len(results.leader_trials)} trials, {len(results.leader_failover)} reboots asked"
            f" right after the kill: kill -> reboot served p50 {p50(results.leader_failover):.1f}"
            f" s, p99 {p99(results.leader_failover):.1f} s (target <= {FAILOVER_TARGET:g} s:"
            f" {met(p99(results.leader_failover) <= FAILOVER_TARGET)})"
        )
    moved = len(results.moved)
    to = ",".join(sorted(str(t) for t in results.moved_to)) or "none"
    lines.append(
        f"one replica added to 3: {moved} of {hosts} hosts moved ({moved / hosts:.1%}; target"
        f" <= {1 / 3:.1%}: {met(moved <= hosts / 3)}; ideal {1 / 4:.1%}), to {to}"
    )
    lines.append(
        f"hosts served by two replicas at once, or twice: {len(results.join_double)} (of"
        f" {len(results.join_asked)} hosts rebooted as r3 took them over, from their BMC"
        f" journals and the replicas' hand-overs); handed over between the power-off and the"
        f" power-on, each command once, in order: {len(results.join_handed)}"
    )
    for host, why in sorted(results.join_double.items())[:10]:
        lines.append(f"    {host}: {why}")
    for count, held in sorted(results.balance.items()):
        lines.append(f"balance at {count} real replicas: {held.says(hosts)}")
    lines.append(
        f"over the whole run: hosts served by two replicas at once, or twice:"
        f" {len(results.run_double)} (every BMC journal against the {results.run_asked} reboots"
        f" asked); handed over between the power-off and the power-on, in order:"
        f" {len(results.run_handed)}"
    )
    for host, why in sorted(results.run_double.items())[:10]:
        lines.append(f"    {host}: {why}")
    named = sum(n for by, n in results.senders.items() if by != "?")
    lines.append(
        f"  power commands journalled: {sum(results.senders.values())}, the sender named for"
        f" {named} (" + ", ".join(f"{by} {n}" for by, n in sorted(results.senders.items())) + ")"
    )
    lines.append(
        f"replicas that exited on their own (could not renew a Lease in time) and were started"
        f" again: {len(results.exits)}"
    )
    lines += [f"    {why}" for why in results.exits]
    return lines


def together(results: Results) -> list[str]:
    """The replicas' CPU summed, and the canary, at each count beside one replica's: the
    work the fleet does in all, and how much slower the machine ran the same unit of work
    (more processes sharing its cores). Where the replicas' sum grows and the canary does
    not, the machine was not slower: the replicas' own work cost more."""
    if 1 not in results.cpu:
        return []
    one, canary = sum(results.cpu[1].values()), results.canary.get(1, float("nan"))
    lines = []
    for count, cpu in sorted(results.cpu.items()):
        used, mine = sum(cpu.values()), results.canary.get(count, float("nan"))
        lines.append(
            f"at {count} replica(s): the replicas' CPU together {used:.1f} % of a core"
            f" ({used / one:.2f}x one replica's); the canary, a fixed unit of work timed in"
            f" the window, {mine:.2f} ms of CPU ({mine / canary:.2f}x)"
        )
    return lines


def memory(results: Results) -> list[str]:
    """Each replica's resident memory at rest beside 1/N of one replica's: what the caches
    every replica keeps (whatever its share) cost in memory."""
    if 1 not in results.memory:
        return []
    one = results.memory[1].get("r0", float("nan"))
    lines = []
    for count, resident in sorted(results.memory.items()):
        if count == 1:
            lines.append(f"memory at rest, 1 replica: {one:.0f} MiB resident")
            continue
        leader = results.leaders.get(count)
        lines.append(
            f"memory at rest, {count} replicas: "
            + ", ".join(
                f"{n}{'*' if n == leader else ''} {v:.0f} MiB ({v / (one / count):.2f}x)"
                for n, v in sorted(resident.items())
            )
            + f" beside 1/{count} of one replica's, {one / count:.0f} MiB"
        )
    return lines


# ---- the simulation -------------------------------------------------------------------------


def host_keys(count: int) -> list[str]:
    """``namespace/name`` of ``count`` hosts, over 20 namespaces as a site of many
    workload clusters would have them."""
    return [f"cluster-{i % 20:02d}/server-{i:06d}" for i in range(count)]


def replica_names(count: int) -> list[str]:
    return [f"metalmend-{i}" for i in range(count)]


def simulate(hosts: int = HOSTS, replicas: tuple[int, ...] = REPLICAS) -> list[str]:
    """The ring as the sharder of ``metalmend-0``, the leader, builds it (itself at
    LEADER_WEIGHT): balance, and the hosts that move when one replica is added or one that
    does not lead is removed."""
    keys = host_keys(hosts)
    lines = [
        f"sharding, simulated: {hosts:,} hosts (metalmend.policy.sharding, pure functions),"
        f" the leader metalmend-0 at {LEADER_WEIGHT:g} of a share"
    ]
    header = (
        f"{'replicas':>8}  {'balance':>8}  {'min..max hosts':>15}  {'one added':>16}"
        f"  {'one removed':>16}  {'ring build':>10}  {'assign all':>10}"
    )
    lines.append(header)
    held = {}
    for count in replicas:
        names = replica_names(count)
        leader = names[0]
        began = time.perf_counter()
        ring = placement(names, leader)
        built = time.perf_counter() - began
        began = time.perf_counter()
        counts = loads(ring, keys)
        assigned = time.perf_counter() - began
        held[count] = Balance.of(counts, leader)
        grown = placement([*names, f"metalmend-{count}"], leader)
        added = moves(ring, grown, keys)
        assert {new for _, new in added.values()} <= {f"metalmend-{count}"}
        shrunk = placement(names[:-1], leader)
        removed = moves(ring, shrunk, keys)
        assert {old for old, _ in removed.values()} <= {names[-1]}
        lines.append(
            f"{count:>8}  {balance(counts):>7.2f}x  "
            f"{min(counts.values()):>6,}..{max(counts.values()):<6,}  "
            f"{len(added) / hosts:>6.1%} (ideal {1 / (count + 1):>5.1%})"
            f"  {len(removed) / hosts:>6.1%} (ideal {1 / count:>5.1%})"
            f"  {built * 1000:>8.1f}ms  {assigned * 1000:>8.1f}ms"
        )
    for count in replicas:
        lines.append(f"balance at {count} replicas: {held[count].says(hosts)}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "--hosts", type=int, default=None,
        help=f"hosts (default {HOSTS:,} simulated, {REAL_HOSTS:,} real)",
    )  # fmt: skip
    parser.add_argument(
        "--simulate", action="store_true",
        help="the assignment by pure functions only (no cluster)",
    )  # fmt: skip
    parser.add_argument("--trials", type=int, default=TRIALS, help="kill -9 trials")
    parser.add_argument(
        "--leader-trials", type=int, default=LEADER_TRIALS,
        help="kill -9 trials of the leader itself",
    )  # fmt: skip
    parser.add_argument("--window", type=float, default=WINDOW, help="the CPU window at rest (s)")
    parser.add_argument(
        "--reboots", type=int, default=REBOOTS, help="hosts rebooted per replica count"
    )
    parser.add_argument(
        "--join-reboots", type=int, default=JOIN_REBOOTS,
        help="reboots asked of hosts the fourth replica takes, as it joins",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.simulate:
        for line in simulate(args.hosts or HOSTS):
            print(line, flush=True)
        return 0
    hosts = args.hosts or REAL_HOSTS
    print(f"sharding benchmark: {hosts} hosts, 1 -> 2 -> 3 -> 4 replicas, {args.trials}"
          f" kill trials, {args.leader_trials} of the leader, 8 replicas", flush=True)  # fmt: skip
    # The replicas inherit this environment: METALMEND_POWER_POLL_BATCH=0 measures the
    # idle polls one at a time (docs/sharding.md, "Idle polls in batches").
    if settings_from_env := sorted(
        k for k in os.environ if k.startswith(("METALMEND_POWER_", "METALMEND_BENCH_"))
    ):
        print("  from the environment (the replicas inherit it): " + ", ".join(
            f"{k}={os.environ[k]}" for k in settings_from_env), flush=True)  # fmt: skip
    # SIGTERM as Ctrl-C: the way out stops every process this run started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    workdir = Path(tempfile.mkdtemp(prefix="metalmend-bench-sharding-"))
    try:
        results = measure(hosts, workdir, args)
    except (TimeoutError, RuntimeError) as error:
        print(f"sharding benchmark stopped: {error}; the logs are in {workdir}", file=sys.stderr)
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    for line in report(hosts, results, args):
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
