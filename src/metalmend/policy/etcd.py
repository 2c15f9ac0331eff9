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
