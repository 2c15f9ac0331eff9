"""The etcd member removal rule and the health verdict, as tables: members x healthy x
threshold x leader (metalmend.teardown.policy.etcd; docs/teardown.md, "remove-etcd")."""

from __future__ import annotations

import pytest

from metalmend.policy.decision import Event
from metalmend.teardown.policy import etcd as policy

pytestmark = pytest.mark.unit

NAMES = "abcde"


def cluster(
    members: int, unhealthy: str = "", threshold: int = 2, leader: str = "a", learners: str = "",
    target: str | None = "a",
) -> policy.ClusterView:  # fmt: skip
    """Members named a, b, c...; ``unhealthy`` and ``learners`` name some of them."""
    facts = tuple(
        policy.MemberFacts(
            id=index + 1, name=name, healthy=name not in unhealthy, leader=name == leader,
            learner=name in learners, client_urls=(f"http://{name}:2379",),
        )
        for index, name in enumerate(NAMES[:members])
    )  # fmt: skip
    target_id = NAMES.index(target) + 1 if target is not None else None
    return policy.ClusterView("k8s", threshold, facts, target_id, node=f"node-{target}")


def only(view: policy.ClusterView) -> policy.Action:
    decision = policy.decide(view)
    assert len(decision.actions) == 1, decision.actions
    action = decision.actions[0]
    assert not isinstance(action, Event)
    return action


# members, unhealthy, threshold, leader, target -> allowed (removal or hand-over first)
REMOVAL = [
    pytest.param(3, "", 2, "b", "a", True, id="3 healthy, threshold 2: a follower may go"),
    pytest.param(
        3,
        "c",
        2,
        "b",
        "a",
        False,
        id="3 members, another down: removing a healthy one loses quorum",
    ),
    pytest.param(
        3, "a", 2, "b", "a", True, id="3 members, the one leaving is down: the other 2 keep quorum"
    ),
    pytest.param(3, "", 3, "b", "a", False, id="threshold 3 of 3: no member may go"),
    pytest.param(
        3, "bc", 1, "b", "a", False, id="2 of 3 down: no quorum now, nothing can be committed"
    ),
    pytest.param(
        5, "e", 3, "b", "a", True, id="5 members, one down, threshold 3: 3 healthy remain"
    ),
    pytest.param(
        5,
        "de",
        3,
        "b",
        "a",
        False,
        id="5 members, 2 down, threshold 3: only 2 healthy would remain",
    ),
    pytest.param(
        5,
        "de",
        2,
        "b",
        "a",
        False,
        id="5 members, 2 down, threshold 2: quorum of 4 is 3, 2 would remain",
    ),
    pytest.param(
        4, "d", 2, "b", "a", True, id="4 members, 1 down: 2 healthy of 3 left is a quorum"
    ),
    pytest.param(
        4, "cd", 1, "b", "d", False, id="4 members, 2 down: no quorum now even to remove a dead one"
    ),
    pytest.param(
        2,
        "",
        2,
        "b",
        "a",
        False,
        id="2 members, threshold 2: one would remain, below the threshold",
    ),
    pytest.param(
        2, "", 1, "b", "a", True, id="2 members, threshold 1: one healthy remains, a quorum of 1"
    ),
    pytest.param(
        1, "", 1, "a", "a", False, id="the last member never goes: the cluster would be gone"
    ),
]


@pytest.mark.parametrize(
    ("members", "unhealthy", "threshold", "leader", "target", "allowed"), REMOVAL
)
def test_a_member_goes_only_if_quorum_and_threshold_remain(
    members: int, unhealthy: str, threshold: int, leader: str, target: str, allowed: bool
) -> None:
    action = only(cluster(members, unhealthy, threshold, leader, target=target))
    if allowed:
        assert isinstance(action, policy.RemoveMember), action
        assert action.member_id == NAMES.index(target) + 1
        assert f"http://{target}:2379" not in action.via  # sent to another member
        assert action.via, "sent to a healthy member"
    else:
        assert isinstance(action, policy.Refuse), action
        assert action.reasons


def test_a_refusal_says_which_rule_and_the_numbers() -> None:
    action = only(cluster(3, unhealthy="c", threshold=2, leader="b"))
    assert isinstance(action, policy.Refuse)
    assert any("would lose quorum" in r and "1 healthy of 2" in r for r in action.reasons)
    assert any("minimum functionality" in r and "the site needs 2" in r for r in action.reasons)


def test_a_member_already_gone_is_success() -> None:
    assert isinstance(only(cluster(2, target=None)), policy.AlreadyGone)


def test_a_leader_hands_over_leadership_first_to_a_healthy_member() -> None:
    action = only(cluster(4, unhealthy="b", threshold=2, leader="a"))
    assert action == policy.MoveLeader("k8s", 1, 3, ("http://a:2379",))  # to c: b is down


def test_a_leader_that_is_refused_is_not_asked_to_hand_over() -> None:
    action = only(cluster(3, unhealthy="c", threshold=2, leader="a"))
    assert isinstance(action, policy.Refuse)


def test_after_the_hand_over_the_former_leader_is_removed_through_the_new_one() -> None:
    action = only(cluster(3, leader="b", target="a"))
    assert isinstance(action, policy.RemoveMember)
    assert action.via[0] == "http://b:2379"  # the leader first: it commits the change


def test_a_learner_may_always_go() -> None:
    action = only(cluster(3, unhealthy="bc", threshold=3, leader="b", learners="a"))
    assert isinstance(action, policy.RemoveMember)


# members, unhealthy, threshold, ignored -> verdict
HEALTH = [
    pytest.param(3, "", 2, None, policy.Health.HEALTHY, id="all healthy"),
    pytest.param(3, "c", 2, None, policy.Health.HEALTHY, id="one down, threshold 2 met"),
    pytest.param(3, "c", 3, None, policy.Health.UNHEALTHY, id="one down, threshold 3 not met"),
    pytest.param(
        3, "bc", 1, None, policy.Health.UNHEALTHY, id="two down: no quorum whatever the threshold"
    ),
    pytest.param(
        3, "", 2, "a", policy.Health.HEALTHY, id="the Node torn down is not counted: 2 left meet 2"
    ),
    pytest.param(
        3, "c", 2, "a", policy.Health.UNHEALTHY, id="not counting the Node torn down, 1 left"
    ),
    pytest.param(2, "", 2, None, policy.Health.HEALTHY, id="after a removal: 2 of 2"),
]


@pytest.mark.parametrize(("members", "unhealthy", "threshold", "ignored", "verdict"), HEALTH)
def test_a_cluster_is_healthy_when_quorum_and_threshold_are_met(
    members: int, unhealthy: str, threshold: int, ignored: str | None, verdict: policy.Health
) -> None:
    view = cluster(members, unhealthy, threshold, leader="b")
    ignore = NAMES.index(ignored) + 1 if ignored else None
    assert policy.health(view, ignore) is verdict


def test_a_cluster_with_no_members_is_unhealthy() -> None:
    assert policy.health(policy.ClusterView("k8s", 1, (), None)) is policy.Health.UNHEALTHY
