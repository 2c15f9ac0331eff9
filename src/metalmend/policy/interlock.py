"""Teardown and remediation never act on the same host at once (docs/design.md, invariant 7).

Both sides claim one object, the Node's BareMetalHost, with a write conditional on the
version of the host they decided on, so that two deciders that both saw a free host
cannot both take it:

- a remediation takes the host by adding its reboot key (``policy.fencing.is_remediation_key``)
  only if the host is unchanged since it saw no teardown claim on it;
- a teardown (any step of ``metalmend serve``: drain, clear-labels, remove-etcd,
  shutdown-kubelet, remove-from-cluster, decommission) takes it by adding the annotation
  ``metalmend.dev/teardown`` only if the host is unchanged since it saw no remediation
  holding it: no remediation reboot key on it, no Metal3Remediation of it in a phase that
  acts (``ACTING_PHASES``), no Machine naming it with a remediation request
  (``host.metal3.io/external-remediation``).

Of two such writes on one version, the API server accepts one; the other is a 409, and
its side decides again from the new version: a teardown then answers 409 Conflict naming
the remediation, a remediation waits (an Event and its status say why).

The claim is kept after the steps are done (the Node is expected to stay NotReady, or to
be gone, until its server is destroyed or redeployed): it ends with the host (deleted
with it) or when an operator removes the annotation. A claim whose Node has been replaced
(a Node of that name with another uid, or another Node on the host) is *stale*: it still
holds remediation off, and says so loudly (a Warning Event) so that an operator releases it.

A remediation that already holds its key when it finds a claim (the claim was written
around this protocol, e.g. by hand) finishes its attempt: stopping half way would leave a
host held off. The teardown refuses such a host. Neither ever acts while the other holds.

The annotation is writable by whoever may annotate the host (a tenant of its namespace,
who may also opt its Machines out of remediation): any value claims the host, and its
fields are read with suspicion (``Claim.from_wire`` never raises, ``describe`` prints
them cut and cleaned).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from metalmend.api import names
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.policy.fencing import is_remediation_key

TEARDOWN_ANNOTATION = "metalmend.dev/teardown"
"""On a BareMetalHost: a teardown of its Node claims the host (JSON: node, nodeUID, by,
since, step)."""

# Metal3Remediation phases (policy.remediation.Phase values) in which the remediation is
# acting on its host or Node: powering it off, fencing, powering on, deleting the Machine.
# In waiting, backoff and failed it acts again only by adding its reboot key, which the
# claim holds off.
ACTING_PHASES = frozenset({"power-off", "fencing", "power-on", "deleting-machine"})

# Condition on a Machine (written by the health check): False while its host is claimed
# by a teardown; back to True once the claim is gone.
CONDITION_HOST_AVAILABLE = "HostAvailableForRemediation"
REASON_BEING_TORN_DOWN = "HostBeingTornDown"
# Events
REASON_HELD_BY_TEARDOWN = "HeldByTeardown"  # a remediation waits for a teardown
REASON_STALE_CLAIM = "StaleTeardownClaim"  # ... whose Node has been replaced
REASON_REMEDIATION_HELD = "RemediationHeld"  # the health check did not ask (Machine Event)

MAX_FIELD = 120  # characters of a claim's field shown in a message


def clean(text: str, limit: int = MAX_FIELD) -> str:
    """``text`` as it may be shown in an Event, a condition or an HTTP body: printable
    characters only (others as ``?``), cut at ``limit`` with a visible mark."""
    shown = "".join(c if c.isprintable() else "?" for c in text[: limit + 1])
    return shown if len(shown) <= limit else shown[:limit] + "...(cut)"


@dataclass(frozen=True)
class Claim:
    """A teardown's claim on a host, as read from ``metalmend.dev/teardown``. Fields that
    are not what teardown writes read as empty; ``readable`` says whether the value was
    teardown's JSON at all."""

    node: str = ""
    node_uid: str = ""
    by: str = ""
    since: dt.datetime | None = None
    step: str = ""
    readable: bool = True
    raw: str = ""  # the value as found (for a message about an unreadable one)

    @classmethod
    def from_wire(cls, value: str | None) -> Claim | None:
        """None without the annotation; any value at all is a claim (never raises)."""
        if value is None:
            return None
        try:
            document = json.loads(value)
        except (ValueError, RecursionError):
            document = None
        if not isinstance(document, dict):
            return cls(readable=False, raw=value)
        return cls(
            node=_field(document, "node"),
            node_uid=_field(document, "nodeUID"),
            by=_field(document, "by"),
            since=_time(document.get("since")),
            step=_field(document, "step"),
            raw=value,
        )

    def to_wire(self) -> str:
        since = stamp(self.since) if self.since else ""
        document = {"node": self.node, "nodeUID": self.node_uid, "by": self.by,
                    "since": since, "step": self.step}  # fmt: skip
        return json.dumps(document, sort_keys=True)

    def describe(self) -> str:
        """One line an operator can read, whatever the value was."""
        if not self.readable:
            return f"an unreadable teardown claim {TEARDOWN_ANNOTATION}={clean(repr(self.raw))}"
        parts = [f"step {clean(self.step)}" if self.step else "",
                 f"by {clean(self.by)}" if self.by else "",
                 f"since {stamp(self.since)}" if self.since else ""]  # fmt: skip
        detail = ", ".join(p for p in parts if p)
        node = f"Node {clean(self.node)}" if self.node else "its Node"
        return f"a teardown of {node}" + (f" ({detail})" if detail else "")


def _field(document: Mapping[str, object], name: str) -> str:
    value = document.get(name)
    return value if isinstance(value, str) else ""


def _time(value: object) -> dt.datetime | None:
    try:
        return parse_stamp(value) if isinstance(value, str) else None
    except (ValueError, OverflowError):
        return None


def teardown_claim(annotations: Mapping[str, str]) -> Claim | None:
    """The teardown claim on a host with these annotations (None: not claimed)."""
    return Claim.from_wire(annotations.get(TEARDOWN_ANNOTATION))


# ---- the remediation side ----------------------------------------------------------------


def claim_stale(claim: Claim, node_name: str | None, node_uid: str | None) -> bool:
    """The claim's Node has been replaced, as seen from the host's Node now (``node_name``,
    ``node_uid``: the Node a remediation of this host would fence, None if none): a Node
    of the claimed name with another uid (registered again), or another Node on the host.
    A claim that names no Node (unreadable, or written by hand) is never called stale."""
    if not claim.node or not node_name:
        return False
    if node_name != claim.node:
        return True
    return bool(claim.node_uid and node_uid and node_uid != claim.node_uid)


def hold_message(host: str, claim: Claim, stale: bool) -> str:
    """Why a remediation of ``host`` waits."""
    message = f"host {host} is claimed by {claim.describe()}: remediation waits"
    if stale:
        message += (
            "; the claim looks stale (its Node has been replaced): remove annotation"
            f" {TEARDOWN_ANNOTATION} from the host to let remediation act"
        )
    return message


# ---- the teardown side ------------------------------------------------------------------


@dataclass(frozen=True)
class RemediationFacts:
    """A Metal3Remediation of the host (its Machine names the host, or it recorded it)."""

    name: str  # "namespace/name"
    phase: str  # status.phase as written ("" when none)


@dataclass(frozen=True)
class HostFacts:
    """One host a teardown must claim, read from the API (not a cache) after ``version``."""

    key: str  # "namespace/name"
    annotations: Mapping[str, str]
    remediations: tuple[RemediationFacts, ...] = ()
    requests: tuple[str, ...] = ()  # Machines naming the host that ask for remediation


@dataclass(frozen=True)
class TeardownView:
    node: str
    node_uid: str
    step: str  # the step asked for ("drain", "decommission", ...)
    by: str  # who asked (the caller's user name)
    hosts: tuple[HostFacts, ...]  # the Node's hosts (api/links.py); () when none


@dataclass(frozen=True)
class ClaimHost:
    """Write ``value`` as the host's teardown claim, only if the host is unchanged."""

    host: str
    value: str


@dataclass(frozen=True)
class ClaimDecision:
    refusals: tuple[str, ...] = ()  # non-empty: 409 Conflict, nothing written
    claims: tuple[ClaimHost, ...] = ()

    @property
    def refused(self) -> bool:
        return bool(self.refusals)


def holding(host: HostFacts) -> list[str]:
    """Every remediation holding ``host``, one line each (empty: none)."""
    found = [
        f"host {host.key} holds remediation reboot key {clean(key)}"
        for key in sorted(host.annotations)
        if is_remediation_key(key)
    ]
    found += [
        f"Metal3Remediation {r.name} of host {host.key} is in phase {clean(r.phase)}"
        for r in host.remediations
        if r.phase in ACTING_PHASES
    ]
    found += [
        f"Machine {machine} of host {host.key} asks for remediation ({names.EXTERNAL_REMEDIATION})"
        for machine in host.requests
    ]
    if names.ESCALATING in host.annotations:
        escalating = clean(host.annotations[names.ESCALATING])
        found.append(
            f"host {host.key} is being escalated by remediation {escalating}: its Machine is"
            " being deleted"
        )
    return found


def decide_claims(view: TeardownView, now: dt.datetime) -> ClaimDecision:
    """Claim every host of the Node, or refuse if any remediation holds one of them. A
    claim already there (this Node's or another's, readable or not) is replaced: a
    teardown is never held up by a claim, only by a remediation."""
    refusals = [line for host in view.hosts for line in holding(host)]
    if refusals:
        return ClaimDecision(refusals=tuple(refusals))
    claims = []
    for host in view.hosts:
        present = teardown_claim(host.annotations)
        same_teardown = (
            present is not None and present.readable and present.node == view.node
            and present.node_uid == view.node_uid
        )  # fmt: skip
        if same_teardown and present is not None and present.step == view.step:
            continue  # nothing to write: this step of this Node's teardown holds it
        since = present.since if same_teardown and present is not None else None
        claim = Claim(view.node, view.node_uid, view.by, since or now, view.step)
        claims.append(ClaimHost(host.key, claim.to_wire()))
    return ClaimDecision(claims=tuple(claims))


def refusal_message(node: str, refusals: Sequence[str]) -> str:
    """The 409 answer's message: the Node, and the first remediation holding it."""
    return f"Node {node} is under remediation and cannot be torn down now: {refusals[0]}"
