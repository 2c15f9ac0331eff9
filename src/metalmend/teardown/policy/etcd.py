"""When an etcd member on a Node being torn down may leave its cluster, and whether a
cluster is healthy, decided purely (docs/teardown.md, "remove-etcd").

Airship's node teardown spec ("Promenade Remove etcd Node", "Promenade Check etcd",
airship-specs ``specs/approved/workflow_node-teardown.rst``) asks that a Node's etcd
members leave their clusters gracefully, and that removal never breaks a cluster: the
site declares, per cluster, a threshold of healthy members it needs for "minimum
functionality" (``promenade/EtcdClusters/v1``). etcd's own check (``--strict-reconfig-check``)
counts members *connected* to the one receiving the request; the rule here counts members
*healthy right now* (each answering its own ``/health``), and both the quorum and the
site's threshold, so a removal etcd would accept can still be refused here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from metalmend.policy.decision import Decision


@dataclass(frozen=True)
class MemberFacts:
    """One member of etcd's own member list, with what was just probed."""

    id: int
    name: str  # empty for a member added but never started
    healthy: bool  # its own /health answered true within the deadline
    leader: bool
    learner: bool = False
    client_urls: tuple[str, ...] = ()
    peer_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterView:
    """What was observed of one cluster for one Node being torn down."""

    cluster: str
    threshold: int  # healthy members the site needs (EtcdClusters' minimum functionality)
    members: tuple[MemberFacts, ...]
    target: int | None  # id of the Node's member in the list; None: not a member (any more)
    node: str = ""


# ---- actions -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AlreadyGone:
    """The Node's member is not in the cluster: nothing to do (a retried removal)."""

    cluster: str
    node: str


@dataclass(frozen=True)
class Refuse:
    """Removing the member would break the cluster; nothing is changed."""

    cluster: str
    node: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class MoveLeader:
    """Ask the leader (the member leaving) to hand leadership to ``to_id`` first, so the
    cluster does not sit through an election when it goes. Sent to the leader itself, as
    etcd requires."""

    cluster: str
    from_id: int
    to_id: int
    via: tuple[str, ...]  # the leader's client URLs


@dataclass(frozen=True)
class RemoveMember:
    """Remove the member; sent to a healthy member other than the one leaving."""

    cluster: str
    member_id: int
    name: str
    via: tuple[str, ...]  # client URLs of the other healthy members, in order of preference


Action = AlreadyGone | Refuse | MoveLeader | RemoveMember


def quorum(voters: int) -> int:
    """Members a cluster of ``voters`` voting members needs to agree on anything."""
    return voters // 2 + 1


def _voters(members: Sequence[MemberFacts]) -> list[MemberFacts]:
    return [m for m in members if not m.learner]


def refusals(view: ClusterView, target: MemberFacts) -> list[str]:
    """Why removing ``target`` would break the cluster, one line each; empty when it may go.

    A learner does not vote: its removal changes neither quorum nor health. For a voter,
    with n voting members now:
    - the change itself must be committed: the healthy voters now must be a quorum of n;
    - without it, the healthy voters left must be a quorum of n - 1 (etcd's own rule, but
      counting members healthy now rather than merely connected);
    - and at least the site's threshold of healthy members must remain.
    """
    if target.learner:
        return []
    voters = _voters(view.members)
    healthy = [m for m in voters if m.healthy]
    left = [m for m in healthy if m.id != target.id]
    n = len(voters)
    reasons = []
    if len(healthy) < quorum(n):
        reasons.append(
            f"cluster {view.cluster} has no quorum now ({len(healthy)} of {n} members"
            f" healthy, {quorum(n)} needed): the removal could not be committed"
        )
    if n - 1 < 1 or len(left) < quorum(n - 1):
        reasons.append(
            f"cluster {view.cluster} would lose quorum without {target.name or target.id}:"
            f" {len(left)} healthy of {n - 1} members would remain,"
            f" {quorum(max(n - 1, 0))} needed"
        )
    if len(left) < view.threshold:
        reasons.append(
            f"cluster {view.cluster} would fall below its minimum functionality without"
            f" {target.name or target.id}: {len(left)} healthy members would remain,"
            f" the site needs {view.threshold}"
        )
    return reasons


def _transferee(view: ClusterView, target: MemberFacts) -> MemberFacts | None:
    """A healthy, started voting member to lead instead: the first by name, so that the
    choice is the same on every attempt."""
    candidates = [
        m
        for m in _voters(view.members)
        if m.healthy and m.name and m.id != target.id and m.client_urls
    ]
    return min(candidates, key=lambda m: (m.name, m.id), default=None)


def decide(view: ClusterView) -> Decision[Action]:
    """One step of taking the Node's member out of its cluster: nothing (already gone),
    a refusal, a leadership hand-over, or the removal. Called again after each step
    with what is observed then, until it answers AlreadyGone or Refuse."""
    decision: Decision[Action] = Decision()
    target = next((m for m in view.members if m.id == view.target), None)
    if target is None:
        return decision.do(AlreadyGone(view.cluster, view.node))
    if reasons := refusals(view, target):
        return decision.do(Refuse(view.cluster, view.node, tuple(reasons)))
    if target.leader and not target.learner:
        successor = _transferee(view, target)
        if successor is not None:
            return decision.do(
                MoveLeader(view.cluster, target.id, successor.id, target.client_urls)
            )
    via = tuple(
        url
        for m in sorted(view.members, key=lambda m: (not m.leader, m.name, m.id))
        if m.healthy and m.id != target.id
        for url in m.client_urls
    )
    return decision.do(RemoveMember(view.cluster, target.id, target.name, via))


# ---- health -------------------------------------------------------------------------------


class Health(StrEnum):
    """What the health endpoint reports per cluster (the spec's HealthMessage values)."""

    HEALTHY = "Healthy"
    UNHEALTHY = "Unhealthy"


def health(view: ClusterView, ignore_node_member: int | None = None) -> Health:
    """Healthy when the members healthy now, not counting the member of the Node being torn
    down (the spec: "ignore the node being torn down from any calculation of health"),
    are both a quorum of the voting members and at least the site's threshold."""
    voters = _voters(view.members)
    healthy = [m for m in voters if m.healthy and m.id != ignore_node_member]
    needed = max(quorum(len(voters)), view.threshold)
    return Health.HEALTHY if voters and len(healthy) >= needed else Health.UNHEALTHY


# ---- adding a member back (a redeployed server) ----------------------------------------


@dataclass(frozen=True)
class AddView:
    """One cluster, observed to bring back the member the design places on a redeployed
    Node. ``members`` is etcd's own (linearizable) list, each probed; ``peer_urls`` the
    design's for the member; ``present``: the id of the listed member with one of those
    peer URLs (None: not listed), so a restart finds an add that already went through."""

    cluster: str
    threshold: int
    members: tuple[MemberFacts, ...]
    peer_urls: tuple[str, ...]
    present: int | None
    expired: bool = False  # the wait for the member is over (its timeout passed)


@dataclass(frozen=True)
class MemberBack:
    """The member is listed, started and healthy: nothing left to do."""

    cluster: str
    member_id: int


@dataclass(frozen=True)
class AwaitMember:
    """The member is listed (added) but not started or not healthy yet: look again."""

    cluster: str
    member_id: int
    why: str


@dataclass(frozen=True)
class AwaitQuorum:
    """Adding now could cost the cluster its quorum; nothing is changed, look again."""

    cluster: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class AddMember:
    """etcd MemberAdd with the design's peer URLs, sent to the healthy members in turn."""

    cluster: str
    peer_urls: tuple[str, ...]
    via: tuple[str, ...]


@dataclass(frozen=True)
class WithdrawMember:
    """The member was added but never started within the wait: remove it again. An added,
    unstarted member counts toward quorum while it cannot vote, so leaving it would cost
    the cluster a failure's worth of tolerance (3 healthy of 4 need all 3)."""

    cluster: str
    member_id: int
    via: tuple[str, ...]


@dataclass(frozen=True)
class GiveUp:
    """The wait is over and nothing is left to undo; ``reason`` says where it stopped."""

    cluster: str
    reason: str


@dataclass(frozen=True)
class CannotAdd:
    """The design does not say how to add the member (no peer URLs): the step fails."""

    cluster: str
    reason: str


AddAction = MemberBack | AwaitMember | AwaitQuorum | AddMember | WithdrawMember | GiveUp | CannotAdd


def add_refusals(view: AddView) -> list[str]:
    """Why adding a voting member now could break the cluster, one line each (empty: it
    may be added). etcd's ``--strict-reconfig-check`` only asks that the started members
    stay a quorum of the larger cluster; this rule asks more, since the new member starts
    with an empty data dir and counts toward quorum before it has caught up:
    - every current voting member healthy right now (a sick member plus the newcomer
      could make two missing votes);
    - those healthy members a quorum of the cluster with the new member (n + 1);
    - no other member added and not started yet (one newcomer at a time);
    - the site's threshold of healthy members already met.
    """
    voters = _voters(view.members)
    healthy = [m for m in voters if m.healthy]
    reasons = []
    if not voters:
        reasons.append(f"cluster {view.cluster} lists no voting member")
    sick = [m.name or f"{m.id:x}" for m in voters if not m.healthy and m.name]
    if sick:
        reasons.append(f"cluster {view.cluster}: member(s) {', '.join(sick)} not healthy")
    if voters and len(healthy) < quorum(len(voters) + 1):
        reasons.append(
            f"cluster {view.cluster}: {len(healthy)} healthy member(s) would not be a quorum"
            f" of {len(voters) + 1} ({quorum(len(voters) + 1)} needed) until the new member"
            " has started"
        )
    unstarted = [m for m in view.members if not m.name]
    if unstarted:
        reasons.append(
            f"cluster {view.cluster}: member {unstarted[0].id:x} was added and has not"
            " started yet: one new member at a time"
        )
    if len(healthy) < view.threshold:
        reasons.append(
            f"cluster {view.cluster} is below its minimum functionality ({len(healthy)}"
            f" healthy, the site needs {view.threshold})"
        )
    return reasons


def decide_add(view: AddView) -> AddAction:
    """One step of bringing the member back, decided again after each: the member is
    found by its peer URLs first (an add that landed before a restart is never sent
    twice), added only while ``add_refusals`` says nothing, then waited for."""
    if not view.peer_urls:
        return CannotAdd(
            view.cluster,
            f"the design gives the member of cluster {view.cluster} no peer_urls: it cannot"
            " be added back",
        )
    if view.present is not None:
        member = next((m for m in view.members if m.id == view.present), None)
        if member is not None and member.name and member.healthy:
            return MemberBack(view.cluster, member.id)
        started = member is not None and bool(member.name)
        why = "not healthy yet" if started else "not started yet"
        if view.expired and not started:
            return WithdrawMember(view.cluster, view.present, _via(view, view.present))
        if view.expired:
            return GiveUp(view.cluster, f"member {view.present:x} started but {why}")
        return AwaitMember(view.cluster, view.present, why)
    if reasons := add_refusals(view):
        if view.expired:
            return GiveUp(view.cluster, "; ".join(reasons))
        return AwaitQuorum(view.cluster, tuple(reasons))
    if view.expired:
        return GiveUp(view.cluster, "the member was not added in time")
    return AddMember(view.cluster, view.peer_urls, _via(view, None))


def _via(view: AddView, leaving: int | None) -> tuple[str, ...]:
    """Client URLs of the healthy members (not ``leaving``), the leader first."""
    return tuple(
        url
        for m in sorted(view.members, key=lambda m: (not m.leader, m.name, m.id))
        if m.healthy and m.id != leaving
        for url in m.client_urls
    )
