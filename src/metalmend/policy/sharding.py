"""Which replica of ``metalmend run`` owns which host: a consistent-hash ring with virtual
nodes over the live members (docs/sharding.md). Pure: no I/O, no clock.

The model is timebertt/kubernetes-controller-sharding's (its docs/design.md) and Ironic's
conductor hash ring: each member is placed on a ring of 64-bit hashes at ``vnodes``
points, and a key (a host's ``namespace/name``) belongs to the member of the first point
at or after the key's own hash, going round. What that gives:

- every replica computes the same assignment from the same member names (the hash is
  blake2b of the text, not Python's ``hash``, which differs per process);
- a member joining takes keys only for itself, about 1/N of them, from every other member
  in proportion; a member leaving gives only its own keys away (``moves``);
- with enough points per member the busiest member holds little more than the mean
  (``VNODES``: at 4 and 8 members, 20,000 hosts, at most 1.15 times the mean,
  ``tests/unit/test_policy_sharding.py``);
- a member may be given fewer points (a weight below 1), and then holds about that
  fraction of another member's share. The sharder gives its own replica, the leader,
  ``LEADER_WEIGHT``: the leader alone runs the fleet-wide controllers (every Node's
  heartbeat, every Machine and health check) on top of its hosts (``placement``).

Moving a key is not decided here: ``step`` says, for one host's labels and the ring, what
the sharder writes next (assign, ask the owner to drain, or nothing), so that a host is
handed over only once its old owner has let it go or is no longer live.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

VNODES = 1000
"""Points per member on the ring. The spread of the busiest member's share falls as
1/sqrt(points): at 1000 the busiest of 4 or 8 members holds at most about 1.1 times the
mean over 20,000 keys, whatever the member names (the hypothesis test draws them), for a
ring of at most a few tens of thousands of points: built once per membership change, in
milliseconds, and a lookup is one binary search."""


LEADER_WEIGHT = 0.75
"""The leader's points over another member's (``runtime.shard_leader_weight``). Measured at
5,000 hosts and Nodes over 4 replicas (docs/sharding.md): the leader's fleet-wide work cost
about a fifth of a replica's share of host-power on top of its hosts, so at the same
weight it ran 1.17x-1.33x a quarter of one replica's CPU while the others ran at 0.85x-1.02x.
Weights are fixed, not derived from the number of members, so that a member joining or
leaving still moves keys only to or from itself."""


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Ring:
    """The ring of ``members`` (replica names), each at ``vnodes`` points times its weight
    (1 unless ``weights`` names it; at least one point)."""

    members: tuple[str, ...]
    points: tuple[int, ...]
    owners: tuple[str, ...]

    @classmethod
    def of(
        cls,
        members: Iterable[str],
        vnodes: int = VNODES,
        weights: Mapping[str, float] | None = None,
    ) -> Ring:
        if vnodes < 1:
            raise ValueError("vnodes must be at least 1")
        weights = weights or {}
        if any(not 0 < w <= 1 for w in weights.values()):
            raise ValueError(f"weights must be above 0 and at most 1, not {dict(weights)}")
        names = tuple(sorted(set(members)))
        # A lighter member's points are the first of its full set: lowering its weight
        # only takes points away, so only its own keys move, each to the next point.
        counts = {n: max(1, round(vnodes * weights.get(n, 1.0))) for n in names}
        placed = sorted((_point(f"{n}#{i}"), n) for n in names for i in range(counts[n]))
        return cls(names, tuple(p for p, _ in placed), tuple(n for _, n in placed))

    def owner(self, key: str) -> str | None:
        """The member owning ``key``; None when there is no member."""
        if not self.points:
            return None
        at = bisect.bisect_left(self.points, _point(key))
        return self.owners[at % len(self.owners)]

    def assign(self, keys: Iterable[str]) -> dict[str, str | None]:
        return {key: self.owner(key) for key in keys}


def placement(
    live: Collection[str], leader: str | None, leader_weight: float = LEADER_WEIGHT
) -> Ring:
    """The ring the sharder assigns by: the live members, the ``leader`` (the sharder's own
    replica, when it is a member) at ``leader_weight``. Every replica that leads computes
    the same ring from the same members. A new leader's ring differs from its
    predecessor's only by the two leaders' points: every host that moves comes from or
    goes to one of the two, about (1 - weight) of a share each way, handed over by drains
    as on any change of members."""
    weights = {leader: leader_weight} if leader is not None and leader in live else None
    return Ring.of(live, weights=weights)


def loads(ring: Ring, keys: Iterable[str]) -> dict[str, int]:
    """How many of ``keys`` each member owns (every member listed, zeros included)."""
    counts = Counter(ring.owner(key) for key in keys)
    return {member: counts.get(member, 0) for member in ring.members}


def balance(counts: Mapping[str, int]) -> float:
    """The busiest member's load over the mean load (1.0: perfectly even)."""
    if not counts or not sum(counts.values()):
        return 1.0
    mean = sum(counts.values()) / len(counts)
    return max(counts.values()) / mean


def weighted_balance(counts: Mapping[str, int], weights: Mapping[str, float]) -> float:
    """The busiest member's load over its fair share, its weight's part of all the keys
    (1 unless ``weights`` names it): ``balance`` for a ring whose members weigh the
    same, and for a lighter leader whether each member holds what its weight asks."""
    total = sum(counts.values())
    if not counts or not total:
        return 1.0
    weight = {m: weights.get(m, 1.0) for m in counts}
    whole = sum(weight.values())
    return max(counts[m] / (total * weight[m] / whole) for m in counts)


def moves(
    before: Ring, after: Ring, keys: Iterable[str]
) -> dict[str, tuple[str | None, str | None]]:
    """The keys whose owner differs between two rings: key -> (old owner, new owner)."""
    moved = {}
    for key in keys:
        old, new = before.owner(key), after.owner(key)
        if old != new:
            moved[key] = (old, new)
    return moved


# ---- one host's hand-over, as the sharder sees it -------------------------------------------


@dataclass(frozen=True)
class Assign:
    """Label the host with ``member``: it was owned by no live member."""

    member: str


@dataclass(frozen=True)
class Drain:
    """Ask the live owner to let the host go (it acknowledges by removing both labels)."""


@dataclass(frozen=True)
class Keep:
    """Nothing to write: owned by the right member, or draining and not yet let go."""


Step = Assign | Drain | Keep


def step(owner: str | None, draining: bool, live: Collection[str], ring: Ring, key: str) -> Step:
    """What the sharder writes next for the host ``key`` whose owner label is ``owner``
    (None: no label) and whose drain label is set or not, given the live members and
    their ring.

    - No owner, or an owner that is no longer live (its Lease expired, so it stopped acting
      at its renew deadline, before the expiry): assign the ring's choice at once. The
      drain label of a dead owner is overwritten with the assignment.
    - A live owner the ring still chooses: keep (a drain asked for earlier stays until the
      owner acknowledges; it then comes back unowned and is assigned to it again).
    - A live owner the ring no longer chooses: ask it to drain, once; the new owner gets
      the host only after the old one removed its label (or its Lease expired)."""
    wanted = ring.owner(key)
    if owner is None or owner not in live:
        return Assign(wanted) if wanted is not None else Keep()
    if owner == wanted or wanted is None or draining:
        return Keep()
    return Drain()


def pending(
    hosts: Iterable[tuple[str, str | None, bool]], live: Collection[str], ring: Ring
) -> tuple[list[str], list[str]]:
    """What a change of the live members gives the sharder to write, from each host's
    ``(key, owner, draining)``: the hosts to assign (unowned, or owned by a member no longer
    live: no one serves them until they are) and the hosts to drain; every other host
    keeps its owner and needs no reconcile."""
    assign: list[str] = []
    drain: list[str] = []
    for key, owner, draining in hosts:
        match step(owner, draining, live, ring, key):
            case Assign():
                assign.append(key)
            case Drain():
                drain.append(key)
            case _:
                pass
    return assign, drain
