"""A cluster with no Machines in the lab (issue 29, point 5): metalmend's NodeHealthCheck
decides, metal3-remediation fences by the out-of-service taint. Real BMCs (Redfish and
IPMI), the real host power controller, the real kube-controller-manager (its
node-lifecycle controller marks the hung Node Unknown, its taint-eviction controller and pod
garbage collector act on the taint), scheduler and StatefulSet controller. The lab's
Machines are deleted first: each Node's BareMetalHost is the one that names it
(``metalmend.dev/node-name``, set by the lab as an operator would), and `metalmend run` runs host-power, node-health-check and
metal3-remediation only (no node-link, no machine-health-check), killed -9 and started again
once at each step of the remediation as it is seen.

Watched from outside every 0.1 s, and through a watch of the Node (every version, in
order): the check makes the remediation for the hung Node; the simulated server is off
before the Node is tainted, and still off when the first tainted version is delivered (while
the Node's pod is still on it); the StatefulSet's pod runs elsewhere only after the taint
(ordered by resourceVersion, as tests/e2e/test_fencing_taint_lab.py does); the host comes
back on and Ready, the taint goes, the remediation is deleted and the check's status shows
every Node healthy again. A second test: a Node with no host is reported, never fenced."""

from __future__ import annotations

import contextlib
import datetime as dt
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import NodeSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.apps_v1 import StatefulSet
from lightkube.resources.core_v1 import Event, Node, Pod

from metalmend.api import names
from metalmend.api.resources import (
    FenceRemediation,
    Machine,
    Metal3Remediation,
    Metal3RemediationTemplate,
    NodeHealthCheck,
)
from metalmend_lab import lab
from metalmend_lab.hosts import NAMESPACE
from tests import support
from tests.e2e.conftest import Metalmend
from tests.e2e.fencing import (
    TaintHistory,
    create_db,
    db_running,
    power_commands,
    power_cycles,
    power_of,
    tainted,
    wait,
)

GRACE = 6.0
PHASE = 240.0  # seconds any one step may take on an idle machine (stretched by the load)
CONTROLLERS = "host-power,node-health-check,metal3-remediation"
TAINT_SETTINGS = {
    "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
    "METALMEND_REMEDIATION_CONFIRM_WINDOW": "2",
    "METALMEND_REMEDIATION_CONFIRM_READS": "3",
    "METALMEND_REMEDIATION_EVACUATION_POLL": "1",
}
CHECK = "workers"
TEMPLATE = "node-fence"
HOSTS = 3


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[lab.RunningLab]:
    options = lab.LabOptions(
        lab_dir=tmp_path_factory.mktemp("nhc-lab"),
        node_monitor_grace_period=GRACE,
        hosts=HOSTS,
        bmc="mixed",
        boot_delay=1.0,
        controllers="",
    )
    with lab.started(options) as running:
        client = running.client()
        # No Machines: a remediation named after a Node must not find a Machine of that
        # name (the lab registers one per host), so the Node is the only link to its host.
        for machine in list(client.list(Machine, namespace=NAMESPACE)):
            assert machine.metadata is not None
            assert machine.metadata.name
            client.delete(Machine, machine.metadata.name, namespace=NAMESPACE)
        wait(lambda: not list(client.list(Machine, namespace="*")), 60, "no Machine left")
        client.create(
            Metal3RemediationTemplate(
                metadata=ObjectMeta(name=TEMPLATE),
                spec={"template": {"spec": {
                    "strategy": "reboot", "powerOffTimeoutSeconds": 60,
                    "powerOnTimeoutSeconds": 120,
                }}},
            ),
            namespace=NAMESPACE,
        )  # fmt: skip
        yield running


@pytest.fixture
def metalmend(fleet: lab.RunningLab, monkeypatch: pytest.MonkeyPatch) -> Iterator[Metalmend]:
    for name, value in TAINT_SETTINGS.items():
        monkeypatch.setenv(name, value)
    process = Metalmend(fleet, CONTROLLERS, 3.0)
    process.start()
    yield process
    process.stop()


def create_check(client: Client, name: str, selector: dict[str, Any], **spec: Any) -> None:
    body = {
        "selector": selector,
        "unhealthyConditions": [
            {"type": "Ready", "status": "Unknown", "duration": "2s"},
            {"type": "Ready", "status": "False", "duration": "2s"},
        ],
        "remediationTemplate": {"namespace": NAMESPACE, "name": TEMPLATE},
        **spec,
    }
    client.create(NodeHealthCheck(metadata=ObjectMeta(name=name), spec=body))


def check_status(client: Client, name: str) -> dict[str, Any]:
    try:
        obj: Any = client.get(NodeHealthCheck, name)
    except ApiError:
        return {}
    return dict(obj.get("status") or {})


def all_healthy(client: Client, name: str, count: int) -> bool:
    status = check_status(client, name)
    return (
        status.get("observedNodes") == count
        and status.get("healthyNodes") == count
        and not status.get("unhealthyNodes")
        and not status.get("inFlightRemediations")
        and status.get("phase") == "Enabled"
    )


def ready(node: Any) -> str:
    conditions = (node.status.conditions if node.status else None) or []
    return next((c.status for c in conditions if c.type == "Ready"), "-")


def remediation_of(client: Client, node: str) -> Any | None:
    try:
        return client.get(Metal3Remediation, node, namespace=NAMESPACE)
    except ApiError:
        return None


@pytest.mark.long
def test_a_hung_node_is_fenced_by_taint_through_its_host_with_metalmend_killed_at_each_step(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    client = fleet.client()
    workdir = fleet.plane.workdir.parent
    wait(
        lambda: len(lab.status(workdir).hosts) == HOSTS
        and all(h.ready == "True" for h in lab.status(workdir).hosts),
        PHASE, "Ready hosts",
    )  # fmt: skip
    # every Node but a control plane's (the lab labels none): the example's selector
    control_plane = {"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}
    create_check(client, CHECK, {"matchExpressions": [control_plane]})
    labels = create_db(client)

    def running() -> tuple[str, int] | None:
        return db_running(client, labels)

    starting: list[threading.Thread] = []
    failed: list[BaseException] = []
    try:
        wait(lambda: running() is not None, PHASE, "db-0 Running")
        wait(lambda: all_healthy(client, CHECK, HOSTS), PHASE,
             f"the check seeing {HOSTS} healthy Nodes")  # fmt: skip
        found = running()
        assert found is not None
        hung = found[0]
        taints = TaintHistory(fleet, hung)
        began, hung_at = time.monotonic(), time.time()
        lab.inject_fault(workdir, hung, "hang")
        at: dict[str, float] = {}
        kills: list[str] = []
        made_uid: str | None = None
        progress = support.Deadline(PHASE)  # for the next step; set again at each

        def start_again() -> None:
            try:
                metalmend.start()
            except BaseException as error:  # reported by settle()
                failed.append(error)

        def settle() -> None:
            """The last start is done (readyz answered), or its failure raised."""
            for thread in starting:
                thread.join()
            starting.clear()
            if failed:
                raise failed[0]

        def restart(step: str) -> None:
            """kill -9 `metalmend run` once this step is seen, and start it again (in the
            background: the watching goes on while it starts)."""
            if step in kills:
                return
            settle()
            metalmend.kill()
            kills.append(step)
            starting.append(threading.Thread(target=start_again, daemon=True))
            starting[-1].start()

        def mark(step: str, now: float) -> None:
            nonlocal progress
            if step not in at:
                at[step] = now
                progress = support.Deadline(PHASE)

        while True:
            assert not progress.expired(), (
                f"no step within {progress} after the last: {at}; status "
                f"{check_status(client, CHECK)}; metalmend run's restarts: {kills}, failed:"
                f" {failed}; {hung}'s BMC journal: {power_commands(workdir, hung, hung_at)}"
            )
            now = time.monotonic() - began
            try:
                node: Any = client.get(Node, hung)
            except ApiError:
                node = None
            assert node is not None, "the taint strategy keeps the Node"
            remediation: Any = remediation_of(client, hung)
            power = power_of(workdir, hung)
            on_node = list(client.list(Pod, namespace="*", fields={"spec.nodeName": hung}))
            if ready(node) != "True":
                mark("unready", now)
            if remediation is not None:
                phase = (remediation.get("status") or {}).get("phase")
                if phase:
                    mark(f"phase {phase}", now)
                if made_uid is None:
                    mark("remediation", now)
                    made_uid = str(remediation.metadata.uid)
                    annotations = remediation.metadata.annotations or {}
                    assert annotations.get(names.REMEDIATED_NODE) == hung
                    assert (remediation.metadata.labels or {}).get(
                        names.NODE_HEALTH_CHECK_LABEL
                    ) == CHECK
                    (owner,) = remediation.metadata.ownerReferences
                    assert (owner.kind, owner.name) == ("NodeHealthCheck", CHECK)
                    assert not tainted(node), f"{hung} tainted before its remediation"
                    restart("remediation")
                    continue
                assert str(remediation.metadata.uid) == made_uid, "one remediation, never two"
            elif made_uid is not None:
                mark("remediation_deleted", now)
            if power == "off" and made_uid is not None and "off" not in at:
                mark("off", now)
                restart("off")
                continue
            if tainted(node):
                if "tainted" not in at:
                    mark("tainted", now)
                    assert "off" in at, f"{hung} tainted before its server was seen off"
                    restart("tainted")
                    continue
                # Read in this order (Node, power, pods): a server on with pods still
                # listed while the Node is tainted: the fence let it on too soon.
                assert power == "off" or not on_node, (
                    f"{hung} tainted while its server is {power} with pods {len(on_node)}"
                )
            elif "tainted" in at:
                mark("untainted", now)
            moved = running()
            if moved is not None and moved[0] != hung and "moved" not in at:
                mark("moved", now)
                taints.assert_tainted_before(moved[1], f"db-0 running on {moved[0]}")
            if "tainted" in at and not on_node:
                mark("pods_gone", now)
            if power == "on" and "off" in at and "powered_on" not in at:
                mark("powered_on", now)
                if tainted(node):  # back on, the taint not yet removed
                    restart("powered_on")
                    continue
            if ready(node) == "True" and "powered_on" in at:
                mark("ready", now)
            if "remediation_deleted" in at and all_healthy(client, CHECK, HOSTS):
                mark("all_healthy", now)
            if {"untainted", "moved", "ready", "all_healthy"} <= at.keys():
                break
            # The flow over (the remediation deleted, every Node healthy) with no taint seen:
            # none will come, nor the steps after it; say so now rather than wait for them.
            assert "all_healthy" not in at or "tainted" in at, (
                f"the remediation of {hung} ended with its Node never seen tainted: {at};"
                f" metalmend run's restarts: {kills}; {hung}'s BMC journal:"
                f" {power_commands(workdir, hung, hung_at)}"
            )
            time.sleep(0.1)
        settle()
        commands = power_commands(workdir, hung, hung_at)
        assert power_cycles(commands) == 1, f"one power cycle of {hung}: its BMC journal {commands}"
        assert not taints.violations, taints.violations
        assert taints.power_at_first_taint == "off", (
            f"the first tainted version of {hung} found its server {taints.power_at_first_taint}"
        )
        assert {"remediation", "off", "tainted"} <= set(kills), kills
        assert at["untainted"] >= at["powered_on"]

        def reasons() -> set[str]:
            return {
                e.reason for e in client.list(Event, namespace="default")
                if e.involvedObject.kind == "NodeHealthCheck" and e.involvedObject.name == CHECK
            }  # fmt: skip

        # Events are recorded after the writes they tell of: waited for, not read once. Only
        # the last one: an Event is told after its write, best effort (as client-go's
        # recorder), and metalmend is killed right after the remediation's creation here,
        # which may come before its Event; no kill follows the removal.
        wanted = {"RemediationRemoved"}
        wait(lambda: wanted <= reasons(), PHASE, f"the check's Events {sorted(wanted)}")
    finally:
        for thread in starting:  # a start under way when something failed
            thread.join()
        client.delete(StatefulSet, "db", namespace=NAMESPACE)
        with contextlib.suppress(ApiError):
            client.delete(NodeHealthCheck, CHECK)
    print(f"metalmend run killed -9 and started again at: {', '.join(kills)}")
    events = sorted(
        (e for e in client.list(Event, namespace=NAMESPACE) if e.involvedObject.name == hung),
        key=lambda e: str(e.lastTimestamp or e.eventTime or ""),
    )
    for event in events:
        print(" ", event.lastTimestamp or event.eventTime, event.involvedObject.kind,
              event.reason, (event.message or "")[:160])  # fmt: skip
    print("node-health-check timeline (s after the hang):",
          {k: round(v, 1) for k, v in sorted(at.items(), key=lambda kv: kv[1])})  # fmt: skip


STRAY = "stray-0"
STRAY_LABEL = "metalmend-lab/stray"


def test_a_node_without_a_host_is_reported_never_fenced(
    fleet: lab.RunningLab, metalmend: Metalmend
) -> None:
    """A Node with no BareMetalHost (a k3s providerID, no annotation) that goes NotReady: the
    check lists it unhealthy and says why (NoBareMetalHost), makes no remediation, and no
    taint is put on it, across a kill -9 of `metalmend run`."""
    client = fleet.client()
    client.create(
        Node(
            metadata=ObjectMeta(name=STRAY, labels={STRAY_LABEL: "yes"}),
            spec=NodeSpec(providerID=f"k3s://{STRAY}"),
        )
    )
    # Its last word: NotReady (no kubelet renews it; the node-lifecycle controller turns it
    # Unknown after the grace period). Without any status, that controller would first wait
    # its node-startup grace period (a minute).
    now = dt.datetime.now(dt.UTC).isoformat()
    condition = {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                 "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip
    client.patch(Node.Status, STRAY, {"status": {"conditions": [condition]}})
    check = "strays"
    try:
        create_check(client, check, {"matchLabels": {STRAY_LABEL: "yes"}}, minHealthy=0)

        def reported() -> bool:
            unhealthy = check_status(client, check).get("unhealthyNodes") or []
            return any(u.get("name") == STRAY for u in unhealthy)

        def warned() -> bool:
            return any(
                e.reason == "NoBareMetalHost" and e.involvedObject.name in (STRAY, check)
                for e in client.list(Event, namespace="default")
            )

        wait(reported, PHASE, f"{check} listing {STRAY} unhealthy")
        wait(warned, PHASE, "a NoBareMetalHost Event")
        metalmend.kill()
        metalmend.start()
        wait(warned, PHASE, "a NoBareMetalHost Event after the restart")
        wait(reported, PHASE, f"{check} still listing {STRAY} unhealthy")
        status = check_status(client, check)
        (row,) = [u for u in status["unhealthyNodes"] if u["name"] == STRAY]
        assert not row.get("remediations"), row
        assert STRAY not in (status.get("inFlightRemediations") or {}), status
        for kind in (Metal3Remediation, FenceRemediation):
            for made in client.list(kind, namespace="*"):
                obj: Any = made
                annotations = obj.metadata.annotations or {}
                assert annotations.get(names.REMEDIATED_NODE) != STRAY, obj.metadata.name
        assert not tainted(client.get(Node, STRAY)), "a Node without a host is never fenced"
    finally:
        with contextlib.suppress(ApiError):
            client.delete(NodeHealthCheck, check)
        with contextlib.suppress(ApiError):
            client.delete(Node, STRAY)
