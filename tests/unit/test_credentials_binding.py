"""Which hosts may use a BMC Secret, and the plan of ``metalmend credentials bind``: pure
rules on Secret and host objects, no I/O."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret

from metalmend.api.indexes import bmc_secret_of
from metalmend.api.resources import BareMetalHost
from metalmend.bmc import CredentialsError
from metalmend.bmc.binding import plan
from metalmend.bmc.credentials import (
    HOSTS_ANNOTATION,
    SECRET_LABEL,
    CredentialStore,
    binding_value,
    bound_hosts,
    check_bound,
    credentials_changed,
    secret_scopes,
)
from metalmend.kube.store import Store

PASSWORD = "p"  # short on purpose: any message that carried it would be caught below


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def secret(
    name: str, namespace: str = "t1", hosts: str | None = None, labelled: bool = True
) -> Secret:
    return Secret(
        metadata=ObjectMeta(
            name=name,
            namespace=namespace,
            resourceVersion="7",
            labels={SECRET_LABEL: "true"} if labelled else None,
            annotations={HOSTS_ANNOTATION: hosts} if hosts is not None else None,
        ),
        data={"username": b64("admin"), "password": b64(PASSWORD)},
    )


def host(name: str, credentials: str | None, namespace: str = "t1") -> Any:
    bmc: dict[str, Any] = {"address": "redfish://10.0.0.1/redfish/v1/Systems/1"}
    if credentials is not None:
        bmc["credentialsName"] = credentials
    return BareMetalHost(metadata=ObjectMeta(name=name, namespace=namespace), spec={"bmc": bmc})


def store(*secrets: Secret) -> CredentialStore:
    cache = Store()
    for obj in secrets:
        cache.upsert(obj)
    return CredentialStore({"t1": cache})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("worker-0", {"worker-0"}),
        (" worker-0 , worker-1,,", {"worker-0", "worker-1"}),
        ("*", {"*"}),
        ("", set()),
    ],
)
def test_the_binding_annotation_is_a_list_of_host_names(value: str, expected: set[str]) -> None:
    assert bound_hosts({HOSTS_ANNOTATION: value}) == expected


def test_binding_values_are_sorted_and_star_wins() -> None:
    assert binding_value({"worker-1", "worker-0"}) == "worker-0,worker-1"
    assert binding_value({"worker-1", "*"}) == "*"


def test_a_secret_is_used_by_the_hosts_it_names_and_no_other() -> None:
    creds = store(secret("bmc", hosts="worker-0,worker-1")).lookup("t1", "worker-1", "bmc")
    assert (creds.username, creds.password) == ("admin", PASSWORD)
    with pytest.raises(CredentialsError) as refused:
        store(secret("bmc", hosts="worker-0")).lookup("t1", "intruder", "bmc")
    message = str(refused.value)
    assert "Secret t1/bmc is not bound to host 'intruder'" in message
    assert "worker-0" not in message  # the refusal does not tell who may


def test_star_binds_every_host_of_the_namespace() -> None:
    creds = store(secret("bmc", hosts="*")).lookup("t1", "anyone", "bmc")
    assert creds.username == "admin"
    assert creds.every_host, "the pool then trusts less (bmc/address.py check_trust)"
    named = store(secret("bmc", hosts="worker-0,*")).lookup("t1", "worker-0", "bmc")
    assert named.every_host, "'*' anywhere in the list binds every host"
    assert not store(secret("bmc", hosts="worker-0")).lookup("t1", "worker-0", "bmc").every_host


@pytest.mark.parametrize(
    ("cache", "credentials", "says"),
    [
        pytest.param(
            store(secret("bmc")), "bmc", "Secret t1/bmc is not bound to any host", id="unbound"
        ),
        pytest.param(
            store(secret("bmc", hosts="")), "bmc", "not bound to any host", id="empty binding"
        ),
        pytest.param(
            store(),
            "bmc",
            f"Secret t1/bmc not found, or not labelled {SECRET_LABEL}=true",
            id="absent or unlabelled",
        ),
        pytest.param(store(), None, "credentialsName is not set", id="not named"),
        pytest.param(
            store(secret("bmc", hosts="*")),
            "kube-system/bmc",
            "points outside the host's namespace",
            id="other namespace",
        ),
    ],
)
def test_refusals_say_why_and_never_the_password(
    cache: CredentialStore, credentials: str | None, says: str
) -> None:
    with pytest.raises(CredentialsError) as refused:
        cache.lookup("t1", "worker-0", credentials)
    assert says in str(refused.value)
    assert "metalmend" in str(refused.value) or "credentialsName" in str(refused.value)
    assert f" {PASSWORD} " not in f" {refused.value} "


def test_a_namespace_outside_the_secret_namespaces_is_refused_by_name() -> None:
    with pytest.raises(CredentialsError, match=r"only in namespaces t1 .*not in 't2'"):
        store(secret("bmc", hosts="*")).lookup("t2", "worker-0", "bmc")


def test_check_bound_accepts_a_named_host() -> None:
    check_bound({HOSTS_ANNOTATION: "a,b"}, "t1/s", "b")


def test_hosts_are_indexed_by_the_secret_they_name_in_their_own_namespace() -> None:
    assert bmc_secret_of(host("worker-0", "bmc")) == ["t1/bmc"]
    assert bmc_secret_of(host("worker-0", "kube-system/bmc")) == []
    assert bmc_secret_of(host("worker-0", None)) == []


@pytest.mark.parametrize(
    ("namespace", "secret_namespaces", "scopes"),
    [
        ("t1", ("t2",), ["t1"]),
        (None, ("t1", "t2", "t1"), ["t1", "t2"]),
        (None, (), [None]),
    ],
)
def test_secret_scopes(
    namespace: str | None, secret_namespaces: tuple[str, ...], scopes: list[str | None]
) -> None:
    assert secret_scopes(namespace, secret_namespaces) == scopes


def test_bind_plan_binds_each_secret_to_the_hosts_naming_it_and_keeps_earlier_ones() -> None:
    hosts = [
        host("worker-0", "shared"),
        host("worker-1", "shared"),
        host("worker-2", "own"),
        host("worker-3", "gone"),
        host("worker-4", "kube-system/stolen"),
        host("worker-5", None),
        host("worker-0", "shared", namespace="t2"),
    ]
    secrets: dict[tuple[str, str], Any] = {
        ("t1", "shared"): secret("shared", labelled=False),
        ("t1", "own"): secret("own", hosts="old-host"),
        ("t1", "gone"): "not found",
        ("t2", "shared"): secret("shared", namespace="t2", hosts="*"),
    }
    bindings = {(b.namespace, b.secret): b for b in plan(hosts, secrets)}
    assert set(bindings) == {("t1", "shared"), ("t1", "own"), ("t1", "gone"), ("t2", "shared")}
    shared = bindings[("t1", "shared")]
    assert (shared.after, shared.labelled, shared.changes) == ("worker-0,worker-1", False, True)
    assert shared.describe(dry_run=True) == (
        "t1/shared: would bind to worker-0,worker-1, label metalmend.dev/bmc-credentials=true added"
    )
    own = bindings[("t1", "own")]
    assert own.after == "old-host,worker-2"
    assert own.describe(dry_run=False) == "t1/own: bound to old-host,worker-2 (was: old-host)"
    gone = bindings[("t1", "gone")]
    assert not gone.changes
    assert gone.describe(dry_run=False) == "t1/gone: skipped, not found (named by worker-3)"
    star = bindings[("t2", "shared")]
    assert (star.after, star.changes) == ("*", False)
    assert star.describe(dry_run=False) == "t2/shared: already labelled and bound to *"


def test_only_changes_that_can_fix_or_break_a_host_wake_its_hosts() -> None:
    bound = secret("bmc", hosts="worker-0")
    assert credentials_changed(None, bound)  # appeared (created, or labelled)
    assert credentials_changed(bound, None)  # gone (deleted, or unlabelled)
    assert credentials_changed(bound, secret("bmc", hosts="worker-0,worker-1"))
    rotated = secret("bmc", hosts="worker-0")
    rotated.data = {"username": b64("admin"), "password": b64("new")}
    assert credentials_changed(bound, rotated)
    relabelled = secret("bmc", hosts=" worker-0 ")
    assert relabelled.metadata is not None
    relabelled.metadata.labels = {SECRET_LABEL: "true", "team": "infra"}
    assert not credentials_changed(bound, relabelled)  # no login spent on metadata
