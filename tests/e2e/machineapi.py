"""What the lab tests of upstream health checkers share (test_openshift_lab.py,
test_capm3_lab.py): a hung host remediated through metalmend while a thread samples the lab
hardware's own power and the Node every 0.1 s, `metalmend run` killed -9 and restarted at
each step it reaches (the request seen, the server off, the Node fenced), and the order of
those steps checked: the server off before its Node is deleted or tainted, the workload
(StatefulSet db, tests.e2e.fencing) Running elsewhere, the checker counting the Machine
healthy again.

When the server went off is read from its BMC's own journal (``<lab>/hardware/<host>.commands``:
every power command the BMC accepted, with the wall-clock time it arrived; the power lands
that long after, ``power_delay``), not from ``status.json``: the power there is the host's
kubelet's view, which reads the power once a second, so a Node deleted at once once the host
is reported off (machine-remediation) can be seen deleted before status.json says off. The
fence's time is when the sampler first saw the Node deleted or tainted (an upper bound:
the check is that the server was off by then)."""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from lightkube import ApiError
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Node, Pod

from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests import support
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import (
    create_db,
    db_running,
    power_commands,
    power_cycles,
    power_of,
    tainted,
    wait,
)

STEPS = ("request", "off", "fenced")  # metalmend run is killed -9 once at each


@dataclass
class Sampler:
    """Every 0.1 s, in a thread: the victim's power as the lab hardware has it (not as
    anything metalmend reports), and its Node (absent: deleted; tainted: out of service).
    Records when each step was first seen (seconds after ``began``) and every sample in
    which the Node was fenced while the server was not yet seen off."""

    fleet: lab.RunningLab
    victim: str
    requested: Callable[[], bool]
    began: float = field(default_factory=time.monotonic)
    at: dict[str, float] = field(default_factory=dict)
    log: list[tuple[float, str, str]] = field(default_factory=list)  # (s, power, node)
    violations: list[str] = field(default_factory=list)
    powers: set[str] = field(default_factory=set)  # of every host, every sample
    fenced_wall: float | None = None  # time.time() when the Node was first seen fenced
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Sampler:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        client = self.fleet.client()
        workdir = self.fleet.plane.workdir.parent
        assert self.fleet.hardware is not None
        names = [h.name for h in self.fleet.hardware.hosts]
        while not self._stop.wait(0.1):
            now = round(time.monotonic() - self.began, 1)
            try:
                self.powers.update(f"{n}:{power_of(workdir, n)}" for n in names)
                power = power_of(workdir, self.victim)
                try:
                    node = client.get(Node, self.victim)
                    state = "tainted" if tainted(node) else "up"
                except ApiError as error:
                    if error.status.code != 404:
                        continue
                    state = "deleted"
                asked = self.requested()
            except (ApiError, OSError, ValueError, KeyError):
                continue  # the API server or the status file mid-write: the next sample
            self.log.append((now, power, state))
            if asked:
                self.at.setdefault("request", now)
            if power == "off":
                self.at.setdefault("off", now)
            if state != "up":
                self.at.setdefault("fenced", now)
                if self.fenced_wall is None:
                    self.fenced_wall = time.time()
            if "fenced" in self.at and power == "on":
                self.at.setdefault("on", now)

    def off_landed(self, since: float, power_delay: float) -> float | None:
        """When the first power-off command the victim's BMC accepted after ``since``
        (wall-clock) landed, from its journal; None: none accepted."""
        journal = Path(self.fleet.plane.workdir.parent) / "hardware" / f"{self.victim}.commands"
        for line in journal.read_text().splitlines() if journal.exists() else []:
            stamp, _, action = line.partition(" ")
            if action in ("hard off", "soft off") and float(stamp) >= since:
                return float(stamp) + power_delay
        return None

    def tail(self) -> list[tuple[float, str, str]]:
        return self.log[-15:]

    def power_offs(self, since: float) -> int:
        """How many power cycles the victim's BMC was told after ``since`` (wall-clock),
        from its own journal: a short off between two samples is not missed."""
        return power_cycles(power_commands(self.fleet.plane.workdir.parent, self.victim, since))


def remediate(
    fleet: lab.RunningLab,
    metalmend: Metalmend,
    requested: Callable[[], bool],
    healthy_again: Callable[[], bool],
    checker_state: Callable[[], object],
    within: float = 300.0,
    redfish_power_delay: float = 1.0,
) -> Sampler:
    """Hang the host running db-0 and follow its remediation to the end: kill -9 and restart
    `metalmend run` at each of STEPS, wait for db-0 running again (a new pod, or the same one
    restarted on the rebooted server) and for
    ``healthy_again()`` (the checker counts every Machine healthy, its request gone). Returns
    the sampler: ``at``, the seconds from the hang to each step and to "healthy"."""
    client = fleet.client()
    labels = create_db(client)
    try:
        wait(lambda: db_running(client, labels) is not None, 120, "db-0 Running",
             tolerate=(ApiError,))  # fmt: skip
        found = db_running(client, labels)
        assert found is not None
        victim = found[0]
        (first,) = client.list(Pod, namespace=NAMESPACE, labels=labels)
        assert first.metadata is not None
        sampler = Sampler(fleet, victim, requested)
        hung_at = time.time()
        lab.inject_fault(fleet.plane.workdir.parent, victim, "hang")
        sampler.began = time.monotonic()
        sampler.start()
        try:
            deadline = support.Deadline(within)
            for step in STEPS:
                wait(lambda step=step: step in sampler.at, max(deadline.left(), 1.0),
                     f"step {step!r} of {victim}'s remediation (metalmend killed at each)",
                     state=lambda: (sampler.at, sampler.tail()))  # fmt: skip
                metalmend.kill()
                metalmend.start()
                print(f"  {step} at {sampler.at[step]}s: metalmend run killed -9, restarted")

            def restarts(pod: Pod) -> int:
                return sum(c.restartCount for c in (pod.status.containerStatuses or []))

            before = restarts(first) if first.status is not None else 0

            def moved() -> bool:
                """db-0 running again after the fence: a new pod, or (the fenced server back
                and its Node registered again before the pod garbage collector removed the
                pod, as a loaded machine makes likely) the same pod restarted on the server
                that was powered off. Either is no fault; the sampler holds what matters:
                no replacement created before the fence."""
                return any(
                    pod.metadata is not None
                    and pod.status is not None
                    and pod.status.phase == "Running"
                    and (pod.metadata.uid != first.metadata.uid or restarts(pod) > before)
                    for pod in client.list(Pod, namespace=NAMESPACE, labels=labels)
                )

            wait(
                moved,
                max(deadline.left(), 1.0),
                "db-0 running again: a new pod, or the same one restarted",
                tolerate=(ApiError,),
            )
            sampler.at["moved"] = round(time.monotonic() - sampler.began, 1)
            wait(healthy_again, max(deadline.left(), 1.0), f"the checker to count {victim} healthy again",
                 tolerate=(ApiError,), state=checker_state)  # fmt: skip
            sampler.at["healthy"] = round(time.monotonic() - sampler.began, 1)
        finally:
            sampler.stop()
        spec = next(h for h in fleet.hardware.hosts if h.name == victim)
        delay = redfish_power_delay if spec.bmc == "redfish" else spec.power_delay
        off = sampler.off_landed(hung_at, delay)
        assert off is not None, f"{victim}'s BMC accepted no power-off: {sampler.tail()}"
        assert sampler.fenced_wall is not None
        assert off <= sampler.fenced_wall, (
            f"{victim}'s Node fenced {off - sampler.fenced_wall:.2f}s before its server went off"
            f" (its BMC's journal): {sampler.tail()}"
        )
        assert sampler.at["request"] <= sampler.at["fenced"], sampler.at
        print(f"{victim}: seconds after the hang: {sampler.at}")
        commands = power_commands(fleet.plane.workdir.parent, victim, hung_at)
        assert sampler.power_offs(hung_at) == 1, (
            f"one power cycle of {victim}: its BMC journal {commands}; sampled: {sampler.log}"
        )
        return sampler
    finally:
        client.delete(StatefulSet, "db", namespace=NAMESPACE)


def not_ready_for(fleet: lab.RunningLab, node: str) -> float:
    """Seconds the Node's Ready condition has been other than True (0 while True)."""
    found = fleet.client().get(Node, node)
    ready = next((c for c in (found.status.conditions or []) if c.type == "Ready"), None)
    if ready is None or ready.status == "True" or ready.lastTransitionTime is None:
        return 0.0
    return (dt.datetime.now(dt.UTC) - ready.lastTransitionTime).total_seconds()


def wait_unhealthy_for(fleet: lab.RunningLab, nodes: list[str], seconds: float) -> None:
    """Until every one of ``nodes`` has been Unknown or NotReady for more than ``seconds``."""
    wait(lambda: all(not_ready_for(fleet, n) > seconds for n in nodes), 120,
         f"the Nodes {nodes} Unknown or NotReady for more than {seconds:g} s",
         tolerate=(ApiError,), state=lambda: {n: not_ready_for(fleet, n) for n in nodes})  # fmt: skip
