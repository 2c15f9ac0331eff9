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
  ``tests/unit/test_policy_sharding.py``).

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


def _point(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Ring:
    """The ring of ``members`` (replica names), each at ``vnodes`` points."""

    members: tuple[str, ...]
    points: tuple[int, ...]
    owners: tuple[str, ...]

    @classmethod
    def of(cls, members: Iterable[str], vnodes: int = VNODES) -> Ring:
        if vnodes < 1:
            raise ValueError("vnodes must be at least 1")
        names = tuple(sorted(set(members)))
        placed = sorted((_point(f"{name}#{i}"), name) for name in names for i in range(vnodes))
        return cls(names, tuple(p for p, _ in placed), tuple(n for _, n in placed))

    def owner(self, key: str) -> str | None:
        """The member owning ``key``; None when there is no member."""
        if not self.points:
            return None
        at = bisect.bisect_left(self.points, _point(key))
        return self.owners[at % len(self.owners)]

    def assign(self, keys: Iterable[str]) -> dict[str, str | None]:
        return {key: self.owner(key) for key in keys}


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
