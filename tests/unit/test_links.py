"""The tenancy rules of api/links.py, as tables: which host a Machine may use, which
providerIDs name which host, when a host confirms its Machine, which Node may be fenced."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from metalmend.api import links
from metalmend.api.links import HostFacts, MachineIdentity, ProviderRef
from metalmend.controllers.tenancy import wanted_condition

# uids as the API server gives them (a providerID's uid part must have this shape)
UID_H1 = "6f0c2a4e-1b7d-4c39-9a5e-0d8f3b2c1a01"
UID_H2 = "6f0c2a4e-1b7d-4c39-9a5e-0d8f3b2c1a02"
UID_OLD = "6f0c2a4e-1b7d-4c39-9a5e-0d8f3b2c1a00"  # of an older host of the same name
MACHINE = MachineIdentity(namespace="t1", name="m1", uid="uid-m1", infrastructure_ref={})
HOST = HostFacts(
    key="t1/h1",
    uid=UID_H1,
    consumer_ref={"apiVersion": "cluster.x-k8s.io/v1beta1", "kind": "Machine", "name": "m1",
                  "namespace": "t1", "uid": "uid-m1"},
)  # fmt: skip


@pytest.mark.parametrize(
    ("annotation", "key", "reason"),
    [
        pytest.param(None, None, "", id="absent"),
        pytest.param("", None, "", id="empty"),
        pytest.param("t1/h1", "t1/h1", "", id="own namespace"),
        pytest.param("h1", "t1/h1", "", id="bare name: the Machine's namespace"),
        pytest.param(" t1/h1 ", "t1/h1", "", id="surrounding blanks"),
        pytest.param("metalmend-lab/worker-2", None, links.REASON_OTHER_NAMESPACE, id="other namespace"),
        pytest.param("T1/h1", None, links.REASON_OTHER_NAMESPACE, id="namespace case matters"),
        pytest.param("t1/h1/x", None, links.REASON_INVALID_REFERENCE, id="three parts"),
        pytest.param("/h1", None, links.REASON_INVALID_REFERENCE, id="empty namespace"),
        pytest.param("t1/", None, links.REASON_INVALID_REFERENCE, id="empty name"),
        pytest.param("../t2/h1", None, links.REASON_INVALID_REFERENCE, id="path tricks"),
    ],
)  # fmt: skip
def test_machine_host(annotation: str | None, key: str | None, reason: str) -> None:
    link = links.machine_host("t1", annotation)
    assert link.key == key
    assert link.reason == reason
    assert link.refused == bool(reason)
    if reason:
        assert annotation is not None
        assert annotation.strip() in link.refusal


def test_index_functions_keep_refused_hosts_out_of_reach() -> None:
    def machine(annotation: str) -> Any:
        meta = SimpleNamespace(
            namespace="t2", name="m", annotations={"metal3.io/BareMetalHost": annotation}
        )
        return SimpleNamespace(metadata=meta)  # fmt: skip

    assert links.host_of(machine("metalmend-lab/worker-2")) == []
    assert links.claimed_host_of(machine("metalmend-lab/worker-2")) == ["metalmend-lab/worker-2"]
    assert links.host_of(machine("worker-2")) == ["t2/worker-2"]
    assert links.claimed_host_of(machine("a/b/c")) == []


# The one table of providerIDs (api/links.parse_provider_id, for Machines and Nodes alike).
@pytest.mark.parametrize(
    ("provider_id", "expected"),
    [
        # metal3's forms
        pytest.param("metal3://t1/h1", ProviderRef("t1", "h1"), id="metalmend form"),
        pytest.param("metal3://t1/h1/m3m-1", ProviderRef("t1", "h1"), id="CAPM3 current form"),
        pytest.param(f"metal3://{UID_H1}", ProviderRef(uid=UID_H1), id="CAPM3 legacy form"),
        pytest.param("metal3://t1/h1.rack-2.example/m3m", ProviderRef("t1", "h1.rack-2.example"),
                     id="a host name with dots (a DNS-1123 subdomain)"),
        pytest.param("metal3://t1/h1/m/x", None, id="four parts"),
        pytest.param("metal3://t1//m", None, id="empty part"),
        pytest.param("metal3://", None, id="nothing"),
        pytest.param("metal3://uid-h1", None, id="legacy form, not a uid"),
        pytest.param(f"metal3://{UID_H1.upper()}", None, id="legacy form, uid not lowercase"),
        pytest.param("metal3://T1/h1", None, id="namespace not a DNS-1123 label"),
        pytest.param("metal3://t1.x/h1", None, id="namespace with a dot"),
        pytest.param(f"metal3://{'n' * 64}/h1", None, id="namespace of 64 characters"),
        pytest.param("metal3://t1/H1", None, id="host not a DNS-1123 subdomain"),
        pytest.param("metal3://t1/-h1", None, id="host starting with a hyphen"),
        pytest.param(f"metal3://t1/{'h' * 254}", None, id="host of 254 characters"),
        pytest.param("metal3://t1/h1/M3M", None, id="Metal3Machine not a DNS-1123 subdomain"),
        pytest.param("metal3://t1/h1\n", None, id="a trailing newline"),
        pytest.param("metal3://t1/..", None, id="path tricks"),
        # OpenShift's metal3 machine provider
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", ProviderRef("t1", "h1", UID_H1),
                     id="OpenShift form with the host uid"),
        pytest.param("baremetalhost:///t1/h1", ProviderRef("t1", "h1"),
                     id="OpenShift older form: names a host, proves nothing"),
        pytest.param("baremetalhost:///t1/h1/uid-h1", None, id="OpenShift, uid not a UUID"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}/x", None, id="OpenShift, a part more"),
        pytest.param(f"baremetalhost:///t1//{UID_H1}", None, id="OpenShift, an empty part"),
        pytest.param("baremetalhost:///t1/h1/", None, id="OpenShift, an empty uid"),
        pytest.param("baremetalhost:///t1", None, id="OpenShift, one part"),
        pytest.param("baremetalhost:///", None, id="OpenShift, nothing"),
        pytest.param(f"baremetalhost:///T1/h1/{UID_H1}", None, id="OpenShift, namespace not a label"),
        pytest.param(f"baremetalhost:///t1/h_1/{UID_H1}", None, id="OpenShift, host not a subdomain"),
        pytest.param(f"baremetalhost://t1/h1/{UID_H1}", None, id="two slashes: a host part, not a path"),
        pytest.param("baremetalhost:////t1/h1", None, id="four slashes"),
        # anything else
        pytest.param("k3s://n1", None, id="another scheme"),
        pytest.param("aws:///eu-west-1a/i-0123", None, id="another provider"),
        pytest.param("test://t1/h1", None, id="another scheme, metal3's shape"),
        pytest.param("", None, id="empty"),
        pytest.param(None, None, id="unset"),
    ],
)  # fmt: skip
def test_parse_provider_id(provider_id: str | None, expected: ProviderRef | None) -> None:
    assert links.parse_provider_id(provider_id) == expected
    assert links.node_uid_ref(provider_id) == (expected.uid if expected else "")
    named = f"{expected.namespace}/{expected.host}" if expected and expected.host else None
    assert links.provider_host_key(provider_id) == named


@pytest.mark.parametrize(
    ("provider_id", "names_it"),
    [
        pytest.param("metal3://t1/h1", True, id="metalmend form"),
        pytest.param("metal3://t1/h1/anything", True, id="CAPM3 form"),
        pytest.param(f"metal3://{UID_H1}", True, id="legacy form, the host's uid"),
        pytest.param(f"metal3://{UID_H2}", False, id="legacy form, another host's uid"),
        pytest.param("metal3://t2/h1", False, id="another namespace"),
        pytest.param("metal3://t1/h2", False, id="another host"),
        pytest.param("test://t1/h1", False, id="another scheme"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", True, id="OpenShift, name and uid"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_OLD}", False,
                     id="OpenShift, a host of that name, made again"),
        pytest.param("baremetalhost:///t1/h1", True, id="OpenShift older form: name only"),
        pytest.param(f"baremetalhost:///t2/h1/{UID_H1}", False, id="OpenShift, another namespace, same uid"),
        pytest.param(f"baremetalhost:///t1/h2/{UID_H1}", False, id="OpenShift, another host, same uid"),
    ],
)  # fmt: skip
def test_provider_id_names_host(provider_id: str, names_it: bool) -> None:
    assert links.provider_id_names_host(provider_id, "t1/h1", UID_H1) is names_it
    assert (links.node_fence_refusal("n1", provider_id, HOST) == "") is names_it


@pytest.mark.parametrize("provider_id", [f"metal3://{UID_H1}", f"baremetalhost:///t1/h1/{UID_H1}"])
def test_a_provider_id_with_a_uid_needs_the_host_uid(provider_id: str) -> None:
    assert not links.provider_id_names_host(provider_id, "t1/h1", "")


def _ref(**changes: str) -> dict[str, str]:
    ref = dict(HOST.consumer_ref or {})
    ref.update(changes)
    return {k: v for k, v in ref.items() if v != "-"}


@pytest.mark.parametrize(
    ("consumer_ref", "host_namespace", "expected"),
    [
        pytest.param(_ref(), "t1", "confirmed", id="this Machine"),
        pytest.param(_ref(uid="-"), "t1", "confirmed", id="without uid"),
        pytest.param(_ref(namespace="-"), "t1", "confirmed", id="namespace defaults to the host's"),
        pytest.param(_ref(uid="uid-old"), "t1", "other", id="a Machine of that name, recreated"),
        pytest.param(_ref(name="m2"), "t1", "other", id="another Machine"),
        pytest.param(_ref(namespace="t2"), "t1", "other", id="a Machine of another namespace"),
        pytest.param(_ref(), "t2", "other", id="host in another namespace"),
        pytest.param(_ref(apiVersion="example.com/v1"), "t1", "other", id="another group"),
        pytest.param(_ref(kind="Metal3Machine", apiVersion="infrastructure.cluster.x-k8s.io/v1beta1"),
                     "t1", "other", id="a Metal3Machine the Machine does not name"),
        pytest.param(None, "t1", "unclaimed", id="no consumer"),
        pytest.param({}, "t1", "unclaimed", id="empty consumer"),
    ],
)  # fmt: skip
def test_consumer_of(
    consumer_ref: dict[str, str] | None, host_namespace: str, expected: str
) -> None:
    assert links.consumer_of(consumer_ref, host_namespace, MACHINE) == expected


def test_a_metal3machine_consumer_confirms_the_machine_that_names_it() -> None:
    infra = {"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta1", "kind": "Metal3Machine",
             "name": "m1-abcde"}  # fmt: skip
    machine = MachineIdentity("t1", "m1", "uid-m1", infra)
    consumer = {**infra, "namespace": "t1"}
    assert links.consumer_of(consumer, "t1", machine) == "confirmed"
    assert links.consumer_of({**consumer, "name": "m2-xyz"}, "t1", machine) == "other"
    assert links.consumer_of(consumer, "t1", MACHINE) == "other"  # names no Metal3Machine


@pytest.mark.parametrize(
    ("provider_id", "host", "confirmed"),
    [
        pytest.param("metal3://t1/h1", HOST, True, id="agreed and confirmed"),
        pytest.param(f"metal3://{UID_H1}", HOST, True, id="legacy form"),
        pytest.param("metal3://t1/h2", HOST, False, id="names another host"),
        pytest.param("metal3://t1/h1", None, False, id="host not found"),
        pytest.param("metal3://t1/h1", HostFacts("t1/h1", UID_H1, None), False, id="host unclaimed"),
        pytest.param("metal3://t1/h1", HostFacts("t1/h1", UID_H1, _ref(name="m2")), False,
                     id="host consumed by another Machine"),
    ],
)  # fmt: skip
def test_confirm_provider_id(provider_id: str, host: HostFacts | None, confirmed: bool) -> None:
    why = links.confirm_provider_id(provider_id, MACHINE, host, "t1/h1")
    assert (why == "") is confirmed


def test_host_key_for_link() -> None:
    own = links.machine_host("t1", "t1/h1")
    none = links.machine_host("t1", None)
    refused = links.machine_host("t1", "lab/worker-2")
    assert links.host_key_for_link(MACHINE, own, "metal3://t1/h9") == "t1/h1"  # the annotation
    assert links.host_key_for_link(MACHINE, none, "metal3://t1/h9") == "t1/h9"
    assert links.host_key_for_link(MACHINE, none, "metal3://lab/worker-2") == ""
    assert links.host_key_for_link(MACHINE, refused, "metal3://t1/h9") == ""
    assert links.host_key_for_link(MACHINE, none, f"metal3://{UID_H1}") == ""


@pytest.mark.parametrize(
    ("provider_id", "allowed"),
    [
        pytest.param(None, True, id="no providerID: no proof either way"),
        pytest.param("metal3://t1/h1", True, id="the host's Node"),
        pytest.param("metal3://t1/h1/m3m", True, id="the host's Node, CAPM3 form"),
        pytest.param(f"metal3://{UID_H1}", True, id="the host's Node, legacy form"),
        pytest.param("metal3://metalmend-lab/worker-2", False, id="a Node of another namespace's host"),
        pytest.param("metal3://t1/h2", False, id="a Node of another host"),
        pytest.param("aws:///eu-west-1a/i-0123", False, id="a Node of another provider"),
    ],
)  # fmt: skip
def test_node_fence_refusal(provider_id: str | None, allowed: bool) -> None:
    refusal = links.node_fence_refusal("n1", provider_id, HOST)
    assert (refusal == "") is allowed
    if not allowed:
        assert "n1" in refusal
        assert "t1/h1" in refusal


def test_key_in_namespace() -> None:
    assert links.key_in_namespace("t1/h1", "t1")
    assert not links.key_in_namespace("t2/h1", "t1")
    assert not links.key_in_namespace("t1/h1/x", "t1")
    assert not links.key_in_namespace("h1", "t1")


def test_condition_written_once_per_refusal_and_cleared_once() -> None:
    now, later = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"
    refused = wanted_condition(None, "HostLinkValid", "no", "HostInOtherNamespace", now)
    assert refused is not None
    assert refused["status"] == "False"
    assert refused["lastTransitionTime"] == now
    assert wanted_condition(refused, "HostLinkValid", "no", "HostInOtherNamespace", later) is None
    cleared = wanted_condition(refused, "HostLinkValid", "", "", later)
    assert cleared is not None
    assert cleared["status"] == "True"
    assert cleared["lastTransitionTime"] == later
    assert wanted_condition(cleared, "HostLinkValid", "", "", later) is None
    assert wanted_condition(None, "HostLinkValid", "", "", now) is None  # never refused: no write
    reworded = wanted_condition(refused, "HostLinkValid", "other", "InvalidHostReference", later)
    assert reworded is not None
    assert reworded["lastTransitionTime"] == now


# ---- a Node without a Machine: the host that confirms it (issue 36, point 1) ----------------


H1 = HostFacts("t1/h1", UID_H1, None)
H2 = HostFacts("t1/h2", "uid-h2", None)


@pytest.mark.parametrize(
    ("provider", "naming", "by_uid", "host", "problem"),
    [
        # the host names its Node (a kubelet cannot write hosts)
        pytest.param(None, [H1], None, "t1/h1", "", id="named by its host"),
        pytest.param("metal3://t1/h1", [H1], None, "t1/h1", "", id="named, providerID agrees"),
        pytest.param("metal3://t1/h1/m3m", [H1], None, "t1/h1", "", id="named, capm3 agrees"),
        pytest.param("k3s://n1", [H1], None, "t1/h1", "", id="named, another scheme"),
        pytest.param("metal3://t1/h2", [H1], None, None, "names another host",
                     id="named, providerID names another host"),
        pytest.param(None, [H1, H2], None, None, "all name Node n1", id="named by two hosts"),
        # the providerID carries the host's uid
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", [], H1, "t1/h1", "", id="openshift uid"),
        pytest.param(f"metal3://{UID_H1}", [], H1, "t1/h1", "", id="legacy uid"),
        pytest.param(f"baremetalhost:///t1/h2/{UID_H1}", [], H1, None, "the uid it carries",
                     id="uid of another host than named"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_OLD}", [], None, None, "which no BareMetalHost has",
                     id="a guessed uid"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", [H2], H1, None, "names Node n1 too",
                     id="uid, and another host names it"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", [H1], H1, "t1/h1", "",
                     id="uid, and the same host names it"),
        # what a kubelet writes alone proves nothing
        pytest.param(None, [], None, None, "no BareMetalHost names Node n1",
                     id="the Node's annotation alone"),
        pytest.param("metal3://t1/h1", [], None, None, "carries no host's uid",
                     id="a metal3 providerID alone"),
        pytest.param("metal3://t1/h1/m3m", [], None, None, "carries no host's uid",
                     id="capm3's providerID alone"),
    ],
)  # fmt: skip
def test_node_host(
    provider: str | None,
    naming: list[HostFacts],
    by_uid: HostFacts | None,
    host: str | None,
    problem: str,
) -> None:
    found = links.node_host("n1", provider, naming, by_uid, annotation="t1/h1")
    assert found.key == host
    assert problem in found.problem
    assert bool(found.problem) is (host is None)


UNGUARDED = "ValidatingAdmissionPolicy metalmend-node-name-writers is not installed"


@pytest.mark.parametrize(
    ("provider", "naming", "by_uid", "host"),
    [
        # the host's word alone: not trusted while anyone who edits hosts could write it
        pytest.param(None, [H1], None, None, id="named by its host"),
        pytest.param("metal3://t1/h1", [H1], None, None, id="named, providerID agrees"),
        pytest.param("k3s://n1", [H1], None, None, id="named, another scheme"),
        # a providerID with the host's uid needs no guard
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", [], H1, "t1/h1", id="openshift uid"),
        pytest.param(f"baremetalhost:///t1/h1/{UID_H1}", [H1], H1, "t1/h1",
                     id="uid, and the same host names it"),
        pytest.param(f"metal3://{UID_H1}", [], H1, "t1/h1", id="legacy uid"),
    ],
)  # fmt: skip
def test_the_hosts_word_counts_only_while_its_writers_are_guarded(
    provider: str | None, naming: list[HostFacts], by_uid: HostFacts | None, host: str | None
) -> None:
    found = links.node_host("n1", provider, naming, by_uid, unguarded=UNGUARDED)
    assert found.key == host
    if host is None:
        assert UNGUARDED in found.problem
        assert "deploy/policies/node-name-writers.yaml" in found.problem
        assert "baremetalhost:///t1/h1/<the host's uid>" in found.problem


def test_the_nodes_own_annotation_is_named_as_proving_nothing() -> None:
    found = links.node_host("n1", None, [], None, annotation="t1/h1")
    assert "metalmend.dev/baremetalhost: t1/h1 proves nothing" in found.problem
    assert "metalmend.dev/node-name: n1 on the host" in found.problem


def test_the_host_index_reads_the_node_it_names() -> None:
    def host(annotations: dict[str, str] | None) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(annotations=annotations))

    assert links.host_named_node(host({"metalmend.dev/node-name": " n1 "})) == ["n1"]
    assert links.host_named_node(host({"metalmend.dev/node-name": ""})) == []
    assert links.host_named_node(host(None)) == []
