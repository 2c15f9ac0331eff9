"""redeploy_server's destroy and deploy_server rules as tables, and a restart between any
two of their actions (metalmend.siteactions.policy.redeploy; docs/site-actions.md, "redeploy_server")."""

from __future__ import annotations

import datetime as dt
import itertools

import pytest

from metalmend.policy.decision import Event
from metalmend.siteactions.policy import redeploy as policy

pytestmark = pytest.mark.unit

T0 = dt.datetime(2026, 11, 24, tzinfo=dt.UTC)
SETTINGS = policy.RedeploySettings(
    destroy_timeout=600, provision_timeout=60, node_ready_timeout=60, poll_interval=2
)
NODE = "n1"


def at(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def actions(decision: object) -> list[type]:
    return [type(a) for a in decision.actions if not isinstance(a, Event)]  # type: ignore[attr-defined]


# ---- destroy -----------------------------------------------------------------------------


def destroy_view(
    task_id: str | None, found: bool = False, outcome: policy.TaskOutcome | None = None
) -> policy.DestroyView:
    return policy.DestroyView(policy.DestroyRecord(task_id, T0), found, outcome, "summary")


@pytest.mark.parametrize(
    ("view", "now", "expected"),
    [
        pytest.param(destroy_view(None), at(0), [policy.RecordTask], id="the-id-is-recorded-first"),
        pytest.param(
            destroy_view("t1"),
            at(1),
            [policy.CreateTask],
            id="recorded-and-not-in-the-store-is-created-under-that-id",
        ),
        pytest.param(
            destroy_view("t1", True, policy.TaskOutcome.RUNNING),
            at(1),
            [],
            id="a-running-task-is-waited-for",
        ),
        pytest.param(
            destroy_view("t1", True, policy.TaskOutcome.DESTROYED),
            at(1),
            [policy.Succeed],
            id="a-destroyed-node-is-the-steps-success",
        ),
        pytest.param(
            destroy_view("t1", True, policy.TaskOutcome.FAILED),
            at(1),
            [policy.Fail],
            id="a-failed-task-is-the-steps-failure",
        ),
        pytest.param(
            destroy_view("t1", True, policy.TaskOutcome.RUNNING),
            at(600),
            [policy.Fail],
            id="a-task-past-the-destroy-timeout-fails-the-step",
        ),
    ],
)
def test_decide_destroy(view: policy.DestroyView, now: dt.datetime, expected: list[type]) -> None:
    decision = policy.decide_destroy(view, now, SETTINGS, "new", NODE)
    assert actions(decision) == expected
    if not expected:
        assert decision.requeue_at == now + dt.timedelta(seconds=2)


def test_the_recorded_id_is_the_one_created_never_a_fresh_one() -> None:
    first = policy.decide_destroy(destroy_view(None), T0, SETTINGS, "id-a", NODE).actions[0]
    assert isinstance(first, policy.RecordTask)
    assert first.record.task_id == "id-a"
    again = policy.decide_destroy(destroy_view("id-a"), T0, SETTINGS, "id-b", NODE).actions[0]
    assert again == policy.CreateTask("id-a")


def test_destroy_record_round_trips_and_reads_hostile_values_as_absent() -> None:
    record = policy.DestroyRecord("t1", T0)
    assert policy.DestroyRecord.from_wire(record.to_wire()) == record
    assert policy.DestroyRecord.from_wire({"task_id": 7, "started": "x"}) == policy.DestroyRecord()


# ---- deploy_server -----------------------------------------------------------------------


def host(state: str = "provisioned", on: bool | None = True) -> policy.HostFacts:
    return policy.HostFacts("h1", state, on, "")


def deploy_view(
    phase: policy.DeployPhase, *, documents: int = 2, bmh: policy.HostFacts | None = None,
    ready: bool | None = None, missing: tuple[str, ...] = (), clusters: tuple[str, ...] = (),
) -> policy.DeployView:  # fmt: skip
    record = policy.DeployRecord(phase, T0)
    return policy.DeployView(NODE, record, documents, bmh, ready, missing, clusters)


P = policy.DeployPhase


@pytest.mark.parametrize(
    ("view", "now", "expected"),
    [
        pytest.param(
            deploy_view(P.APPLY),
            at(0),
            [policy.ApplyHostDocuments, policy.SetRecord],
            id="apply-the-hosts-documents-then-record-it",
        ),
        pytest.param(
            deploy_view(P.APPLY, documents=0),
            at(0),
            [policy.Fail],
            id="a-design-without-the-host-fails",
        ),
        pytest.param(
            deploy_view(P.PROVISION, bmh=host("provisioning", False)),
            at(5),
            [],
            id="provisioning-is-waited-for",
        ),
        pytest.param(
            deploy_view(P.PROVISION, bmh=host("provisioned", False)),
            at(5),
            [],
            id="provisioned-but-not-reported-on-is-waited-for",
        ),
        pytest.param(
            deploy_view(P.PROVISION, bmh=host()),
            at(5),
            [policy.SetRecord],
            id="provisioned-and-on-moves-to-the-node",
        ),
        pytest.param(
            deploy_view(P.PROVISION, bmh=host("provisioning error", False)),
            at(5),
            [policy.Fail],
            id="a-provisioning-error-fails-at-once",
        ),
        pytest.param(
            deploy_view(P.PROVISION, bmh=host("provisioning", False)),
            at(60),
            [policy.Fail],
            id="not-provisioned-within-the-timeout-fails",
        ),
        pytest.param(deploy_view(P.NODE), at(5), [], id="no-node-yet-is-waited-for"),
        pytest.param(
            deploy_view(P.NODE, ready=False),
            at(60),
            [policy.Fail],
            id="a-node-not-ready-within-the-timeout-fails",
        ),
        pytest.param(
            deploy_view(P.NODE, ready=True),
            at(5),
            [policy.SetRecord],
            id="a-ready-node-moves-to-its-labels",
        ),
        pytest.param(
            deploy_view(P.LABELS, missing=("role",)),
            at(5),
            [policy.ApplyNodeLabels, policy.SetRecord],
            id="missing-labels-are-applied",
        ),
        pytest.param(
            deploy_view(P.LABELS),
            at(5),
            [policy.SetRecord],
            id="labels-already-there-are-not-written-again",
        ),
        pytest.param(
            deploy_view(P.ETCD, clusters=("kubernetes",)),
            at(5),
            [policy.BringEtcdBack, policy.ReleaseTeardownClaim, policy.SetRecord],
            id="a-designed-member-is-brought-back",
        ),
        pytest.param(
            deploy_view(P.ETCD),
            at(5),
            [policy.ReleaseTeardownClaim, policy.SetRecord],
            id="no-designed-member-nothing-to-add",
        ),
        pytest.param(deploy_view(P.DONE), at(5), [policy.Succeed], id="done-succeeds"),
    ],
)
def test_decide_deploy(view: policy.DeployView, now: dt.datetime, expected: list[type]) -> None:
    decision = policy.decide_deploy(view, now, SETTINGS)
    assert actions(decision) == expected
    if not expected:
        assert decision.requeue_at == now + dt.timedelta(seconds=2)


def test_each_phase_moves_to_the_next_in_order() -> None:
    order = [P.APPLY, P.PROVISION, P.NODE, P.LABELS, P.ETCD, P.DONE]
    for phase, following in itertools.pairwise(order):
        view = deploy_view(phase, bmh=host(), ready=True)
        record = next(
            a for a in policy.decide_deploy(view, at(1), SETTINGS).actions
            if isinstance(a, policy.SetRecord)
        )  # fmt: skip
        assert record.record.phase is following
        assert record.record.since == at(1)  # the next phase's timeout counts from here


def test_deploy_record_round_trips_and_an_unknown_phase_starts_over() -> None:
    record = policy.DeployRecord(P.ETCD, T0, ("kubernetes",))
    assert policy.DeployRecord.from_wire(record.to_wire()) == record
    assert policy.DeployRecord.from_wire({"phase": "bogus"}).phase is P.APPLY
    assert record.add_requested("kubernetes") is record


def test_event_reasons_name_the_step() -> None:
    assert policy.event_reason("deploy_server") == "ShipyardDeployServer"
    assert policy.event_reason("remove_from_cluster") == "ShipyardRemoveFromCluster"


# ---- a restart between any two actions ------------------------------------------------------


class World:
    """What the actions change: tasks created, erases, member adds; and the saved record."""

    def __init__(self) -> None:
        self.saved: policy.DestroyRecord = policy.DestroyRecord()
        self.tasks: dict[str, int] = {}  # task id -> times created

    def view(self) -> policy.DestroyView:
        found = self.saved.task_id in self.tasks
        done = policy.TaskOutcome.DESTROYED if found else None
        return policy.DestroyView(self.saved, found, done, "destroyed")


@pytest.mark.parametrize("crash_after", range(4))
def test_a_restart_after_any_destroy_action_never_creates_a_second_task(crash_after: int) -> None:
    world = World()
    ids = iter(f"id-{n}" for n in range(10))  # each run would mint a fresh id
    done, performed = False, 0
    while not done:
        for action in policy.decide_destroy(world.view(), T0, SETTINGS, next(ids), NODE).actions:
            if performed == crash_after:
                performed += 1
                break  # the process dies here: memory lost, the world and the record kept
            performed += 1
            match action:
                case policy.RecordTask(record=record):
                    world.saved = record
                case policy.CreateTask(task_id=task_id):
                    world.tasks[task_id] = world.tasks.get(task_id, 0) + 1
                case policy.Succeed():
                    done = True
    assert list(world.tasks.values()) == [1]


# ---- the design's documents for one host ----------------------------------------------------


def kube_doc(
    kind: str, name: str, api: str, namespace: str | None = "site", **rest: object
) -> dict:
    meta: dict[str, object] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta.update(rest.pop("meta", {}))  # type: ignore[arg-type]
    data = {"apiVersion": api, "kind": kind, "metadata": meta, **rest}
    return {"schema": policy.KUBERNETES_OBJECT, "metadata": {"name": name}, "data": data}


BMH_API, MACHINE_API = "metal3.io/v1alpha1", "cluster.x-k8s.io/v1beta1"
REF = {"kind": "Machine", "name": "m1", "namespace": "site"}


def test_a_hosts_documents_are_its_bmh_the_machine_it_names_and_its_node_labels() -> None:
    found = policy.host_documents(
        [
            kube_doc("BareMetalHost", "n1", BMH_API, spec={"consumerRef": REF}),
            kube_doc("Machine", "m1", MACHINE_API),
            kube_doc("Machine", "m2", MACHINE_API),
            kube_doc("Node", "n1", "v1", namespace=None, meta={"labels": {"role": "w"}}),
            kube_doc("BareMetalHost", "n2", BMH_API),
        ],
        "n1",
    )
    assert found.host is not None
    assert found.host_key == ("site", "n1")
    assert found.machine is not None
    assert found.machine["metadata"]["name"] == "m1"
    assert found.labels == {"role": "w"}
    assert len(found.objects) == 2


@pytest.mark.parametrize(
    "documents",
    [
        pytest.param([kube_doc("BareMetalHost", "n1", "v1")], id="another-api-version-is-not-it"),
        pytest.param([kube_doc("BareMetalHost", "n9", BMH_API)], id="another-name-is-not-it"),
        pytest.param(
            [
                {
                    "schema": "other/Schema/v1",
                    "data": kube_doc("BareMetalHost", "n1", BMH_API)["data"],
                }
            ],
            id="another-schema-is-not-a-kubernetes-object",
        ),
        pytest.param(["text", None, {"schema": policy.KUBERNETES_OBJECT, "data": []}], id="junk"),
    ],
)
def test_what_is_not_the_hosts_bmh_is_never_applied(documents: list[object]) -> None:
    assert policy.host_documents(documents, "n1").objects == ()


def test_a_machine_in_another_namespace_than_the_ref_says_is_not_applied() -> None:
    found = policy.host_documents(
        [
            kube_doc("BareMetalHost", "n1", BMH_API, spec={"consumerRef": REF}),
            kube_doc("Machine", "m1", MACHINE_API, namespace="elsewhere"),
        ],
        "n1",
    )
    assert found.machine is None


def test_labels_missing_names_absent_and_different_values_only() -> None:
    wanted = {"a": "1", "b": "2", "c": "3"}
    assert policy.labels_missing(wanted, {"a": "1", "b": "x", "z": "9"}) == ("b", "c")


def test_every_redeploy_server_step_has_its_runner_in_order() -> None:
    from metalmend.siteactions.redeploy import STEPS

    assert tuple(STEPS) == policy.STEPS
    assert policy.STEPS == (
        "preflight", "design_lookup", "validation", "decommission", "destroy",
        "remove_from_cluster", "deploy_server",
    )  # fmt: skip
