"""Adding a redeployed server's etcd member back, as a table: members x healthy x unstarted x
threshold x already listed (metalmend.teardown.policy.etcd.decide_add; docs/site-actions.md,
"redeploy_server")."""

from __future__ import annotations

import pytest
import yaml

from metalmend.teardown.etcd import design as designs
from metalmend.teardown.policy import etcd as policy

pytestmark = pytest.mark.unit

NAMES = "abcde"
NEW_PEER = "http://x:2380"


def cluster(
    members: int, unhealthy: str = "", threshold: int = 1, unstarted: int = 0,
    listed: str = "", peer_urls: tuple[str, ...] = (NEW_PEER,), expired: bool = False,
) -> policy.AddView:  # fmt: skip
    """Started members a, b, c...; ``unstarted`` nameless members added before;
    ``listed``: the new member is already in the list ("" no, "unstarted", "started",
    "sick")."""
    facts = [
        policy.MemberFacts(
            id=index + 1, name=name, healthy=name not in unhealthy, leader=index == 0,
            client_urls=(f"http://{name}:2379",), peer_urls=(f"http://{name}:2380",),
        )
        for index, name in enumerate(NAMES[:members])
    ]  # fmt: skip
    facts += [
        policy.MemberFacts(id=100 + i, name="", healthy=False, leader=False)
        for i in range(unstarted)
    ]
    present = None
    if listed:
        present = 99
        facts.append(
            policy.MemberFacts(
                id=99, name="" if listed == "unstarted" else "x", healthy=listed == "started",
                leader=False, peer_urls=(NEW_PEER,),
            )
        )  # fmt: skip
    return policy.AddView("k8s", threshold, tuple(facts), peer_urls, present, expired)


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        pytest.param(cluster(2), policy.AddMember, id="two-healthy-members-may-take-a-third"),
        pytest.param(cluster(4), policy.AddMember, id="four-healthy-members-may-take-a-fifth"),
        pytest.param(
            cluster(1),
            policy.AwaitQuorum,
            id="one-member-alone-would-lose-quorum-until-the-new-one-starts",
        ),
        pytest.param(
            cluster(4, unhealthy="d"),
            policy.AwaitQuorum,
            id="any-sick-member-waits-even-if-quorum-would-hold",
        ),
        pytest.param(
            cluster(2, unstarted=1),
            policy.AwaitQuorum,
            id="another-member-added-and-not-started-waits-one-newcomer-at-a-time",
        ),
        pytest.param(
            cluster(2, threshold=3),
            policy.AwaitQuorum,
            id="below-the-sites-minimum-functionality-waits",
        ),
        pytest.param(
            cluster(2, listed="unstarted"),
            policy.AwaitMember,
            id="already-listed-by-peer-url-is-never-added-twice",
        ),
        pytest.param(
            cluster(1, listed="unstarted"),
            policy.AwaitMember,
            id="already-listed-waits-even-where-a-new-add-would-be-refused",
        ),
        pytest.param(
            cluster(2, listed="sick"), policy.AwaitMember, id="started-but-not-healthy-waits"
        ),
        pytest.param(
            cluster(2, listed="started"),
            policy.MemberBack,
            id="listed-started-and-healthy-is-back",
        ),
        pytest.param(
            cluster(2, listed="unstarted", expired=True),
            policy.WithdrawMember,
            id="added-and-never-started-in-time-is-withdrawn-to-keep-fault-tolerance",
        ),
        pytest.param(
            cluster(2, listed="sick", expired=True),
            policy.GiveUp,
            id="a-started-member-is-never-withdrawn",
        ),
        pytest.param(
            cluster(1, expired=True), policy.GiveUp, id="quorum-never-allowed-the-add-in-time"
        ),
        pytest.param(cluster(2, expired=True), policy.GiveUp, id="no-add-after-the-wait-is-over"),
        pytest.param(
            cluster(2, listed="started", expired=True),
            policy.MemberBack,
            id="back-just-in-time-is-back",
        ),
        pytest.param(
            cluster(2, peer_urls=()),
            policy.CannotAdd,
            id="a-design-member-without-peer-urls-cannot-be-added",
        ),
    ],
)
def test_decide_add(view: policy.AddView, expected: type) -> None:
    assert isinstance(policy.decide_add(view), expected)


def test_add_is_sent_to_healthy_members_leader_first_with_the_designs_peer_urls() -> None:
    action = policy.decide_add(cluster(3))
    assert isinstance(action, policy.AddMember)
    assert action.peer_urls == (NEW_PEER,)
    assert action.via == ("http://a:2379", "http://b:2379", "http://c:2379")


def test_every_reason_to_wait_is_named() -> None:
    reasons = policy.add_refusals(cluster(3, unhealthy="bc", threshold=3, unstarted=1))
    assert len(reasons) == 4, reasons
    assert any("b, c not healthy" in r for r in reasons)


def test_the_etcd_design_reads_the_same_from_a_revisions_documents_as_from_yaml() -> None:
    text = """
schema: promenade/EtcdClusters/v1
metadata: {schema: metadata/Document/v1, name: etcd-clusters}
data:
  clusters:
    - name: kubernetes
      minimum_functionality: {healthy_members: 2}
      members:
        - {node: n1, client_urls: ["http://a:2379"], peer_urls: ["http://a:2380"]}
        - {node: n2, client_urls: ["http://b:2379"], peer_urls: ["http://b:2380"]}
"""
    documents = list(yaml.safe_load_all(text))
    from_store = designs.from_documents(documents, "design revision 4")
    assert from_store == designs.parse(text, "design revision 4")
    assert from_store.clusters_on("n2")[0].member_on("n2").peer_urls == ("http://b:2380",)  # type: ignore[union-attr]
    with pytest.raises(designs.DesignError, match="no promenade/EtcdClusters/v1") as missing:
        designs.from_documents([{"schema": "other/Kind/v1"}], "design revision 5")
    assert missing.value.missing


def test_a_withdrawal_is_sent_to_the_other_healthy_members() -> None:
    action = policy.decide_add(cluster(2, listed="unstarted", expired=True))
    assert action == policy.WithdrawMember("k8s", 99, ("http://a:2379", "http://b:2379"))
