"""deploy/policies/ on the real API server: malformed reboot values refused at admission,
only named users and groups may touch reboot annotations or the shard labels, and only
named ones may change spec.bmc of an existing host."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import ApiError, Client, KubeConfig, codecs
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import Subject
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.api.names import SHARD_DRAIN_LABEL as DRAIN
from metalmend.api.names import SHARD_REPLICA_LABEL as REPLICA
from metalmend.api.resources import BareMetalHost
from metalmend_lab.controlplane import ControlPlane
from tests.support import Deadline, grant

POLICIES = Path(__file__).resolve().parents[2] / "deploy" / "policies"


def scoped(kube: Client, file: str, namespace: str) -> Iterator[None]:
    """Install a policy file, with its binding limited to ``namespace`` (the shared test
    cluster must not see it) and its parameters in that namespace; remove it after."""
    created: list[Any] = []
    for document in yaml.safe_load_all((POLICIES / file).read_text()):
        meta, spec = document["metadata"], document.get("spec", {})
        if document["kind"] == "ConfigMap":
            meta["namespace"] = namespace
        else:
            meta["name"] = f"{meta['name']}-{namespace}"
        if document["kind"] == "ValidatingAdmissionPolicyBinding":
            spec["policyName"] = f"{spec['policyName']}-{namespace}"
            selector = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            spec["matchResources"] = {"namespaceSelector": selector}
            if "paramRef" in spec:
                spec["paramRef"]["namespace"] = namespace
        obj = kube.create(codecs.from_dict(document))
        if document["kind"] != "ConfigMap":
            created.append(obj)
    yield
    for obj in reversed(created):  # the binding before its policy
        kube.delete(type(obj), obj.metadata.name)


@pytest.fixture
def value_policy(kube: Client, namespace: str) -> Iterator[None]:
    yield from scoped(kube, "reboot-annotation-values.yaml", namespace)


@pytest.fixture
def writer_policy(kube: Client, namespace: str) -> Iterator[None]:
    yield from scoped(kube, "reboot-annotation-writers.yaml", namespace)


@pytest.fixture
def bmc_policy(kube: Client, namespace: str) -> Iterator[None]:
    yield from scoped(kube, "bmc-spec-writers.yaml", namespace)


def host(name: str, annotations: dict[str, str]) -> Any:
    return BareMetalHost(
        metadata=ObjectMeta(name=name, annotations=annotations),
        spec={"online": True, "bmc": {"address": "ipmi://127.0.0.1:1"}},
    )


def refused(attempt: Any, within: float = 180.0) -> ApiError:
    """The first refusal by the policy's own rule (the policy takes a moment to be enforced
    after creation, and its binding a moment more to see its parameters: until then it
    refuses with "failed to configure binding", which says nothing of the rule)."""
    deadline = Deadline(within)
    while True:
        try:
            attempt()
        except ApiError as error:
            if "failed to configure binding" not in str(error.status.message):
                return error
        if deadline.expired():
            raise AssertionError("never refused")
        time.sleep(0.2)


def annotate(client: Client, namespace: str, name: str, changes: dict[str, str | None]) -> Any:
    return client.patch(
        BareMetalHost, name, {"metadata": {"annotations": changes}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


def test_malformed_reboot_values_are_refused_at_admission(
    kube: Client, namespace: str, value_policy: None
) -> None:
    counter = itertools.count()

    def create_bad() -> None:
        name = f"bad-{next(counter)}"
        kube.create(host(name, {"reboot.metal3.io/client": "{mode: hard"}), namespace=namespace)
        kube.delete(BareMetalHost, name, namespace=namespace)

    error = refused(create_bad)
    assert error.status.code in (400, 422)
    assert "malformed reboot annotation value on reboot.metal3.io/client" in str(
        error.status.message
    )
    for value in ("", '{"mode":"hard"}', "{'mode':'soft'}", '{"mode": "hard", "force": true}'):
        kube.create(host(f"ok-{next(counter)}", {"reboot.metal3.io": value}), namespace=namespace)
    kube.create(host("shared", {}), namespace=namespace)
    bad = refused(lambda: annotate(kube, namespace, "shared", {"reboot.metal3.io": "hard"}))
    assert "reboot.metal3.io" in str(bad.status.message)


def test_only_named_writers_touch_reboot_annotations(
    control_plane: ControlPlane, kube: Client, namespace: str, writer_policy: None
) -> None:
    everyone = Subject(kind="Group", name="system:authenticated")
    grant(
        kube,
        namespace,
        "edit-hosts",
        everyone,
        group="metal3.io",
        resources=["baremetalhosts"],
        verbs=["get", "patch"],
    )
    kube.create(host("h1", {}), namespace=namespace)
    kube.create(host("probe", {}), namespace=namespace)
    probes = itertools.count()
    # Enforced? The admin is not a named writer either; each probe uses a new key, so an
    # attempt that lands before the policy is active does not mask a later one.
    refused(lambda: annotate(kube, namespace, "probe", {f"reboot.metal3.io/p{next(probes)}": ""}))
    alice = Client(KubeConfig.from_file(control_plane.user_kubeconfig("alice", ["site-ops"])))
    bob = Client(
        KubeConfig.from_file(control_plane.user_kubeconfig("bob", ["metalmend:rebooters"]))
    )

    with pytest.raises(ApiError) as caught:
        annotate(alice, namespace, "h1", {"reboot.metal3.io/alice": ""})
    error = caught.value
    assert error.status.code == 403
    assert "alice may not add, change or remove reboot annotations" in str(error.status.message)
    annotate(alice, namespace, "h1", {"owner": "alice"})  # other annotations: as RBAC says
    annotate(bob, namespace, "h1", {"reboot.metal3.io/bob": '{"mode":"hard"}'})
    with pytest.raises(ApiError) as removal:
        annotate(alice, namespace, "h1", {"reboot.metal3.io/bob": None})
    assert removal.value.status.code == 403
    annotate(bob, namespace, "h1", {"reboot.metal3.io/bob": None})
    final = kube.get(BareMetalHost, "h1", namespace=namespace).metadata.annotations
    assert final == {"owner": "alice"}


@pytest.fixture
def shard_policy(kube: Client, namespace: str) -> Iterator[None]:
    yield from scoped(kube, "shard-label-writers.yaml", namespace)


def label(client: Client, namespace: str, name: str, changes: dict[str, str | None]) -> Any:
    return client.patch(
        BareMetalHost, name, {"metadata": {"labels": changes}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


def test_only_named_writers_touch_shard_labels(
    control_plane: ControlPlane, kube: Client, namespace: str, shard_policy: None
) -> None:
    """docs/sharding.md: moving a host between replicas by hand would skip the drain the
    old owner acknowledges. The narrowest role that reaches the refusal: patch on hosts."""
    everyone = Subject(kind="Group", name="system:authenticated")
    grant(
        kube, namespace, "edit-hosts", everyone,
        group="metal3.io", resources=["baremetalhosts"], verbs=["get", "patch"],
    )  # fmt: skip
    kube.create(host("h1", {}), namespace=namespace)
    kube.create(host("probe", {}), namespace=namespace)
    probes = itertools.count()
    # Enforced? The admin is not a named writer either (a new value each time: see above).
    refused(lambda: label(kube, namespace, "probe", {REPLICA: f"r{next(probes)}"}))
    alice = Client(KubeConfig.from_file(control_plane.user_kubeconfig("alice", ["site-ops"])))
    metalmend = Client(
        KubeConfig.from_file(
            control_plane.user_kubeconfig(
                "system:serviceaccount:metalmend-system:metalmend", ["system:authenticated"]
            )
        )
    )
    carol = Client(
        KubeConfig.from_file(control_plane.user_kubeconfig("carol", ["metalmend:shard-admins"]))
    )
    label(metalmend, namespace, "h1", {REPLICA: "r0"})  # the leader assigns
    for changes in ({REPLICA: "r1"}, {REPLICA: None}, {DRAIN: "true"}):
        with pytest.raises(ApiError) as caught:
            label(alice, namespace, "h1", changes)
        assert caught.value.status.code == 403
        message = str(caught.value.status.message)
        assert "alice may not add, change or remove the shard labels" in message
    label(alice, namespace, "h1", {"rack": "r7"})  # other labels: as RBAC says
    label(metalmend, namespace, "h1", {DRAIN: "true"})  # the leader asks for a drain
    label(metalmend, namespace, "h1", {REPLICA: None, DRAIN: None})  # the owner lets go
    label(carol, namespace, "h1", {REPLICA: "r2"})  # an operator named in the ConfigMap
    final = kube.get(BareMetalHost, "h1", namespace=namespace).metadata.labels
    assert final == {"rack": "r7", REPLICA: "r2"}


def set_bmc(client: Client, namespace: str, name: str, bmc: dict[str, Any]) -> Any:
    return client.patch(
        BareMetalHost, name, {"spec": {"bmc": bmc}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip


def test_only_named_users_change_the_bmc_of_an_existing_host(
    control_plane: ControlPlane, kube: Client, namespace: str, bmc_policy: None
) -> None:
    """A tenant who may edit hosts cannot repoint a host (bound to a BMC Secret) at an
    address of their own; creating hosts and editing the rest of the spec stay as RBAC
    says."""
    everyone = Subject(kind="Group", name="system:authenticated")
    grant(
        kube, namespace, "edit-hosts", everyone,
        group="metal3.io", resources=["baremetalhosts"], verbs=["get", "create", "patch"],
    )  # fmt: skip
    kube.create(host("probe", {}), namespace=namespace)
    probes = itertools.count()
    # Enforced? The admin is not a named writer either (a new port each time, see above).
    refused(
        lambda: set_bmc(
            kube, namespace, "probe", {"address": f"ipmi://127.0.0.1:{next(probes) + 2}"}
        )
    )
    alice = Client(KubeConfig.from_file(control_plane.user_kubeconfig("alice", ["tenants"])))
    ops = Client(
        KubeConfig.from_file(control_plane.user_kubeconfig("olga", ["metalmend:bmc-admins"]))
    )

    alice.create(host("h1", {}), namespace=namespace)  # creating stays allowed
    for change in (
        {"address": "redfish+https://203.0.113.7/redfish/v1/Systems/1"},
        {"credentialsName": "someone-elses-bmc"},
        {"disableCertificateVerification": True},
    ):
        with pytest.raises(ApiError) as caught:
            set_bmc(alice, namespace, "h1", change)
        assert caught.value.status.code == 403
        assert (
            "alice may not change spec.bmc of existing BareMetalHost h1 (its BMC address and"
            " credentials); see ConfigMap metalmend-system/metalmend-bmc-writers"
        ) in str(caught.value.status.message)
    alice.patch(
        BareMetalHost, "h1", {"spec": {"online": False}},
        namespace=namespace, patch_type=PatchType.MERGE,
    )  # fmt: skip  # the rest of the spec: as RBAC says
    set_bmc(ops, namespace, "h1", {"address": "ipmi://127.0.0.1:2", "credentialsName": "bmc"})
    final: Any = kube.get(BareMetalHost, "h1", namespace=namespace)
    assert final["spec"]["bmc"] == {"address": "ipmi://127.0.0.1:2", "credentialsName": "bmc"}
    assert final["spec"]["online"] is False


def bmc_secret(kube: Client, namespace: str, name: str, hosts: str | None) -> None:
    annotations = {"metalmend.dev/bmc-hosts": hosts} if hosts is not None else None
    kube.create(
        Secret(
            metadata=ObjectMeta(
                name=name, namespace=namespace, annotations=annotations,
                labels={"metalmend.dev/bmc-credentials": "true"},
            ),
            stringData={"username": "u", "password": "p"},
        )
    )  # fmt: skip


def named_host(name: str, secret: str) -> Any:
    return BareMetalHost(
        metadata=ObjectMeta(name=name),
        spec={"online": True, "bmc": {"address": "ipmi://127.0.0.1:1", "credentialsName": secret}},
    )


def test_only_named_users_create_a_host_naming_a_secret_bound_to_other_hosts(
    control_plane: ControlPlane, kube: Client, namespace: str, bmc_policy: None
) -> None:
    """A tenant who may create hosts cannot create one that names a BMC Secret bound to
    other hosts ("*", or a list naming others): the new host would choose where that
    Secret's password goes. A Secret bound to the new host alone is the usual case."""
    everyone = Subject(kind="Group", name="system:authenticated")
    grant(
        kube, namespace, "create-hosts", everyone,
        group="metal3.io", resources=["baremetalhosts"], verbs=["get", "create"],
    )  # fmt: skip
    bmc_secret(kube, namespace, "shared-bmc", "worker-0,worker-1")
    bmc_secret(kube, namespace, "every-bmc", "*")
    bmc_secret(kube, namespace, "own-bmc", "h-own")
    bmc_secret(kube, namespace, "unbound-bmc", None)
    probes = itertools.count()
    # Enforced? The admin is not a named writer either (a new host each time).
    refused(
        lambda: kube.create(named_host(f"probe-{next(probes)}", "every-bmc"), namespace=namespace)
    )
    alice = Client(KubeConfig.from_file(control_plane.user_kubeconfig("alice", ["tenants"])))
    ops = Client(
        KubeConfig.from_file(control_plane.user_kubeconfig("olga", ["metalmend:bmc-admins"]))
    )
    for name, secret, hosts in (
        ("worker-9", "shared-bmc", "worker-0,worker-1"),
        ("worker-0", "shared-bmc", "worker-0,worker-1"),  # named, but with another
        ("h-any", "every-bmc", "*"),
    ):
        with pytest.raises(ApiError) as caught:
            alice.create(named_host(name, secret), namespace=namespace)
        assert caught.value.status.code == 403
        assert (
            f"alice may not create BareMetalHost {name} naming BMC Secret {secret}: it is bound"
            f" to other hosts (metalmend.dev/bmc-hosts: {hosts})"
        ) in str(caught.value.status.message)
        assert not list(
            kube.list(BareMetalHost, namespace=namespace, fields={"metadata.name": name})
        )
    alice.create(named_host("h-own", "own-bmc"), namespace=namespace)  # bound to it alone
    alice.create(named_host("h-unbound", "unbound-bmc"), namespace=namespace)  # host-power: no
    alice.create(named_host("h-missing", "no-such-secret"), namespace=namespace)
    ops.create(named_host("worker-9", "shared-bmc"), namespace=namespace)  # a BMC writer


def test_policies_are_valid_admission_objects(kube: Client) -> None:
    kinds = [
        obj.kind
        for file in sorted(POLICIES.glob("*.yaml"))
        for obj in codecs.load_all_yaml(file.read_text())
    ]
    # one binding each: spec.bmc writers (two), MachineHealthCheck and NodeHealthCheck
    # templates, reboot annotation values and writers, shard labels, node-name writers
    assert kinds.count("ValidatingAdmissionPolicy") == 8
    assert kinds.count("ValidatingAdmissionPolicyBinding") == 8
