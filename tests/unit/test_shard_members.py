"""Which replicas are live, from their shard Leases (kube.shards.Members), and what
/metrics says of the shares (controllers.metrics.shard_samples). No API server: Leases as
an informer would bring them, and a clock of our own."""

from __future__ import annotations

import datetime as dt

import pytest
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from metalmend.api import names
from metalmend.api.resources import BareMetalHost
from metalmend.controllers.metrics import shard_samples
from metalmend.kube.shards import Members, Sharding, lease_name
from metalmend.runner import shard_member
from metalmend.settings import RuntimeSettings, Settings, SettingsError, load

T0 = dt.datetime(2026, 11, 28, tzinfo=dt.UTC)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def lease(member: str, holder: str = "", renewed: int = 0, duration: int = 15) -> Lease:
    return Lease(
        metadata=ObjectMeta(
            name=lease_name("metalmend", member),
            namespace="metalmend-system",
            labels={names.SHARD_RING_LABEL: "metalmend", names.SHARD_REPLICA_LABEL: member},
        ),
        spec=LeaseSpec(
            holderIdentity=holder or None,
            renewTime=T0 + dt.timedelta(seconds=renewed),
            leaseDurationSeconds=duration,
        ),
    )


def test_a_member_is_live_until_its_record_has_not_changed_for_its_duration() -> None:
    clock = Clock()
    members = Members(15.0, now=clock)
    members.observe(None, lease("a", "a_1"))
    members.observe(None, lease("b", "b_1"))
    assert members.live() == {"a", "b"}
    assert members.next_change() == 15.0
    clock.now += 10
    members.observe(lease("a", "a_1"), lease("a", "a_1", renewed=10))  # a renews
    clock.now += 5  # b not renewed for 15 s by our clock: expired
    assert members.live() == {"a"}
    assert members.next_change() == 10.0
    # The same record again (a relist) is not a renewal.
    members.observe(lease("a", "a_1", renewed=10), lease("a", "a_1", renewed=10))
    clock.now += 10
    assert members.live() == frozenset()
    assert members.next_change() is None


def test_a_released_or_deleted_lease_is_not_live_at_once() -> None:
    members = Members(15.0, now=Clock())
    members.observe(None, lease("a", "a_1"))
    members.observe(lease("a", "a_1"), lease("a", "", renewed=3, duration=1))  # released
    assert members.live() == frozenset()
    members.observe(None, lease("b", "b_1"))
    members.observe(lease("b", "b_1"), None)  # deleted
    assert members.live() == frozenset()


def test_a_lease_without_a_member_label_counts_for_no_one() -> None:
    members = Members(15.0, now=Clock())
    stray = lease("a", "a_1")
    assert stray.metadata is not None
    stray.metadata.labels = {names.SHARD_RING_LABEL: "metalmend"}
    members.observe(None, stray)
    assert members.live() == frozenset()


def host(name: str, owner: str | None) -> BareMetalHost:
    labels = {names.SHARD_REPLICA_LABEL: owner} if owner else {}
    return BareMetalHost(metadata=ObjectMeta(name=name, namespace="ns", labels=labels))


def test_shard_hosts_per_live_replica_and_none_for_the_rest() -> None:
    hosts = [host("a1", "a"), host("a2", "a"), host("d1", "dead"), host("u1", None)]
    samples = shard_samples(hosts, {"a", "b"})
    assert samples == [
        ("metalmend_shard_hosts", ("a",), 2.0),
        ("metalmend_shard_hosts", ("b",), 0.0),
        ("metalmend_shard_hosts", ("none",), 2.0),
        ("metalmend_shard_replicas_live", (), 2.0),
    ]


def test_a_replicas_default_name_is_its_host_name_as_a_label() -> None:
    assert shard_member("metalmend-0") == "metalmend-0"
    assert shard_member("Node_7.example.org") == "node-7-example-org"
    assert shard_member("x" * 80) == "x" * 50
    assert shard_member("___") == "metalmend"


def test_the_shard_lease_is_named_and_labelled_for_its_ring() -> None:
    sharding = Sharding(member="metalmend-1", ring="metalmend", namespace="ms")
    assert sharding.lease_name == "metalmend-shard-metalmend-1"
    assert sharding.lease_labels == {
        names.SHARD_RING_LABEL: "metalmend",
        names.SHARD_REPLICA_LABEL: "metalmend-1",
    }


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"METALMEND_RUNTIME_SHARD": "true"}, "METALMEND_RUNTIME_SHARD needs runtime.leader_elect"),
        (
            {"METALMEND_RUNTIME_LEADER_ELECT": "true", "METALMEND_RUNTIME_SHARD_ID": "Bad_Name"},
            "METALMEND_RUNTIME_SHARD_ID must be a DNS label",
        ),
    ],
)
def test_sharding_settings_are_checked(env: dict[str, str], problem: str) -> None:
    with pytest.raises(SettingsError, match=problem):
        load(environ=env)


def test_sharding_is_off_by_default() -> None:
    assert Settings().runtime == RuntimeSettings()
    assert not RuntimeSettings().shard
