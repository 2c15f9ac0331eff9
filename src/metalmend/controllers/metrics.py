"""What the controllers report on /metrics for an operator to chart: reboot requests
pending, hosts in BMC error, remediations by phase and by outcome, fences.

The gauges are counted from the informer caches when /metrics is read (kube/metrics.py,
``from_cache``): no API call, no bookkeeping per event. The functions that count are pure
(objects in, samples out) and every label has a fixed set of values: a phase, mode or
error type that is not one of ours (status and annotations are writable by others) is
counted as ``other``, so no object can add a series. Host, Machine and Node names never
become labels.
"""

from __future__ import annotations

import contextlib
import datetime as dt
from collections import Counter as Tally
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import Counter

from metalmend.api import links, names
from metalmend.api.reboot import reboot_requests
from metalmend.api.stamps import parse_stamp
from metalmend.bmc.errors import POWER_MANAGEMENT_ERROR, REGISTRATION_ERROR
from metalmend.kube.metrics import CacheGauge, cache_gauge
from metalmend.kube.metrics import Sample as Sample  # for the controllers
from metalmend.kube.metrics import from_cache as from_cache  # for the controllers
from metalmend.policy import remediation as remediation_policy

OTHER = "other"
METAL3_REMEDIATION = "metal3-remediation"
MACHINE_REMEDIATION = "machine-remediation"
FENCE_REMEDIATION = "fence-remediation"
REQUESTERS = (METAL3_REMEDIATION, MACHINE_REMEDIATION, OTHER)
MODES = ("hard", "soft")
ERROR_TYPES = (REGISTRATION_ERROR, POWER_MANAGEMENT_ERROR, OTHER)
NOT_STARTED = "not-started"  # a Metal3Remediation without status.phase yet
METAL3_PHASES = (NOT_STARTED, *(str(p) for p in remediation_policy.PHASES), OTHER)
# The annotation-driven flow keeps no phase: a Machine asking for remediation is waiting
# for its host's reboot key, or its host holds the key (powered off, fenced, on again).
WAITING_TO_START, POWER_CYCLING = "waiting-to-start", "power-cycling"
MACHINE_PHASES = (WAITING_TO_START, POWER_CYCLING)

REBOOT_REQUESTS = cache_gauge(
    CacheGauge(
        "metalmend_reboot_requests_pending",
        "Reboot annotations (reboot.metal3.io[/key]) on BareMetalHosts, by who asked and mode.",
        ("requester", "mode"),
    )
)
REBOOT_OLDEST = cache_gauge(
    CacheGauge(
        "metalmend_reboot_request_oldest_age_seconds",
        "Age of the oldest pending reboot (status.provisioning.pendingRebootSince of a host"
        " that still carries a reboot annotation); 0 when none is pending.",
        (),
    )
)
POWER_OWNER = cache_gauge(
    CacheGauge(
        "metalmend_power_owner",
        "Who sends power commands to the hosts' BMCs, as metalmend run decided at start"
        " (1 for the owner in use): metalmend's host-power, or baremetal-operator.",
        ("owner",),
    )
)


def power_owner_samples(owner: str) -> list[Sample]:
    owners = [
        str(o) for o in remediation_policy.PowerOwner if o != remediation_policy.PowerOwner.AUTO
    ]
    return [(POWER_OWNER.name, (o,), 1 if o == owner else 0) for o in owners]


HOSTS_BMC_ERROR = cache_gauge(
    CacheGauge(
        "metalmend_hosts_bmc_error",
        "BareMetalHosts whose last BMC attempt failed (operationalStatus error), by errorType.",
        ("error_type",),
    )
)
POWER_ON, POWER_OFF, UNKNOWN = "on", "off", "unknown"
POWER_STATES = (POWER_ON, POWER_OFF, UNKNOWN)
HOSTS_POWER = cache_gauge(
    CacheGauge(
        "metalmend_hosts_power",
        "BareMetalHosts by status.poweredOn (on, off; unknown: not read yet).",
        ("state",),
    )
)
POLL_INTERVAL = cache_gauge(
    CacheGauge(
        "metalmend_power_poll_interval_seconds",
        "Seconds between two routine BMC power reads of a settled host: configured"
        " (power.poll_interval), and effective: longer when reading every host that often"
        " would be more than power.poll_budget reads a second in this process.",
        ("kind",),
    )
)
BMC_WAITING = cache_gauge(
    CacheGauge(
        "metalmend_bmc_waiting_calls",
        "BMC calls waiting in line for a busy BMC endpoint (turned away, to be tried again"
        " when their namespace's turn comes), by the host's namespace. Namespaces, not host"
        " names: a namespace is made by an operator, and it leaves the gauge with its last"
        " waiting call.",
        ("namespace",),
    )
)


def bmc_waiting_samples(counts: Mapping[str, int]) -> list[Sample]:
    return [(BMC_WAITING.name, (namespace,), n) for namespace, n in sorted(counts.items())]


REMEDIATIONS = cache_gauge(
    CacheGauge(
        "metalmend_remediations",
        "Remediations under way, by controller and phase.",
        ("controller", "phase"),
    )
)

# A MachineHealthCheck's RemediationAllowed=False: remediation (and so fencing) is held
# back, by the short-circuit (maxUnhealthy, unhealthyRange) or a spec it cannot use.
BLOCKED_REASONS = (names.REASON_TOO_MANY_UNHEALTHY, names.REASON_INVALID_SPEC, OTHER)
CHECKS_BLOCKED = cache_gauge(
    CacheGauge(
        "metalmend_health_checks_remediation_blocked",
        "MachineHealthChecks whose condition RemediationAllowed is False, by its reason"
        " (TooManyUnhealthy: the short-circuit, maxUnhealthy or unhealthyRange; InvalidSpec).",
        ("reason",),
    )
)


def blocked_check_samples(checks: Iterable[Any]) -> list[Sample]:
    counts: Tally[str] = Tally()
    for check in checks:
        conditions = _status(check).get("conditions")
        for condition in conditions if isinstance(conditions, list) else ():
            if (
                isinstance(condition, Mapping)
                and condition.get("type") == names.CONDITION_REMEDIATION_ALLOWED
                and condition.get("status") == "False"
            ):
                reason = condition.get("reason")
                counts[reason if reason in BLOCKED_REASONS else OTHER] += 1
    return [(CHECKS_BLOCKED.name, (r,), counts[r]) for r in BLOCKED_REASONS]


PHASE_ENTERED = Counter(
    "metalmend_remediation_phase_entered_total",
    "Remediation phase changes written, by controller and the phase entered.",
    ["controller", "phase"],
)
OUTCOMES = Counter(
    "metalmend_remediation_outcomes_total",
    "Remediation attempts that ended, by controller and outcome (power_cycled: the host was"
    " off, its Node fenced and back; attempt_failed, machine_deleted, cannot_start).",
    ["controller", "outcome"],
)
FENCES = Counter(
    "metalmend_fences_total",
    "Fencing actions on a Node whose host was reported off, by controller, method and"
    " outcome (success or error: the API server refused or failed the write).",
    ["controller", "method", "outcome"],
)

# Metal3Remediation phase entered -> the attempt's outcome (phases not listed: under way).
PHASE_OUTCOME: Mapping[remediation_policy.Phase, str] = {
    remediation_policy.Phase.WAITING: "power_cycled",
    remediation_policy.Phase.BACKOFF: "attempt_failed",
    remediation_policy.Phase.DELETING_MACHINE: "machine_deleted",
    remediation_policy.Phase.FAILED: "cannot_start",
}
# What alerts watch (docs/runbooks.md) exists from the start at 0: increase() sees the first.
for _outcome in PHASE_OUTCOME.values():
    OUTCOMES.labels(METAL3_REMEDIATION, _outcome)
for _method in remediation_policy.FenceMethod:
    FENCES.labels(METAL3_REMEDIATION, _method, "error")
FENCES.labels(MACHINE_REMEDIATION, "delete-node", "error")


def requester_of(key: str) -> str:
    if key.startswith(names.METAL3_REMEDIATION_REBOOT_PREFIX):
        return METAL3_REMEDIATION
    if key == names.MACHINE_REMEDIATION_REBOOT:
        return MACHINE_REMEDIATION
    return OTHER


def _annotations(obj: Any) -> Mapping[str, str]:
    return obj.metadata.annotations or {}


def _status(obj: Any) -> Mapping[str, Any]:
    status = obj.get("status")
    return status if isinstance(status, Mapping) else {}


def reboot_samples(hosts: Iterable[Any], now: dt.datetime) -> list[Sample]:
    """Reboot requests pending, by (requester, mode), and the oldest one's age."""
    counts: Tally[tuple[str, str]] = Tally()
    oldest: dt.datetime | None = None
    for host in hosts:
        requests = reboot_requests(_annotations(host))
        if not requests:
            continue
        for request in requests:
            counts[requester_of(request.key), request.mode] += 1
        provisioning = _status(host).get("provisioning")
        since = _stamp(provisioning.get("pendingRebootSince")) if isinstance(
            provisioning, Mapping
        ) else None  # fmt: skip
        if since is not None and (oldest is None or since < oldest):
            oldest = since
    samples: list[Sample] = [
        (REBOOT_REQUESTS.name, (who, mode), counts[who, mode])
        for who in REQUESTERS
        for mode in MODES
    ]
    age = max((now - oldest).total_seconds(), 0.0) if oldest is not None else 0.0
    samples.append((REBOOT_OLDEST.name, (), age))
    return samples


def power_samples(hosts: Iterable[Any]) -> list[Sample]:
    """Hosts by status.poweredOn: on, off, or unknown (not read yet, or not a boolean)."""
    counts: Tally[str] = Tally()
    for host in hosts:
        on = _status(host).get("poweredOn")
        counts[POWER_ON if on is True else POWER_OFF if on is False else UNKNOWN] += 1
    return [(HOSTS_POWER.name, (state,), counts[state]) for state in POWER_STATES]


def poll_interval_samples(configured: float, effective: float) -> list[Sample]:
    return [
        (POLL_INTERVAL.name, ("configured",), configured),
        (POLL_INTERVAL.name, ("effective",), effective),
    ]


def bmc_error_samples(hosts: Iterable[Any]) -> list[Sample]:
    counts: Tally[str] = Tally()
    for host in hosts:
        status = _status(host)
        if status.get("operationalStatus") == "error":
            kind = status.get("errorType")
            counts[kind if kind in ERROR_TYPES else OTHER] += 1
    return [(HOSTS_BMC_ERROR.name, (kind,), counts[kind]) for kind in ERROR_TYPES]


def metal3_remediation_samples(
    remediations: Iterable[Any], controller: str = METAL3_REMEDIATION
) -> list[Sample]:
    """Remediation objects by status.phase: Metal3Remediations, or FenceRemediations
    (``controller`` fence-remediation: the same phases, the same flow)."""
    counts: Tally[str] = Tally()
    for remediation in remediations:
        phase = _status(remediation).get("phase") or NOT_STARTED
        counts[phase if phase in METAL3_PHASES else OTHER] += 1
    return [(REMEDIATIONS.name, (controller, p), counts[p]) for p in METAL3_PHASES]


def machine_remediation_samples(machines: Iterable[Any], hosts: Iterable[Any]) -> list[Sample]:
    """Machines asking for remediation (host.metal3.io/external-remediation): their host
    holds the machine-remediation reboot key (power-cycling) or not yet."""
    holding = {
        f"{h.metadata.namespace}/{h.metadata.name}"
        for h in hosts
        if names.MACHINE_REMEDIATION_REBOOT in _annotations(h)
    }
    counts: Tally[str] = Tally()
    for machine in machines:
        if names.EXTERNAL_REMEDIATION not in _annotations(machine):
            continue
        cycling = any(key in holding for key in links.host_of(machine))
        counts[POWER_CYCLING if cycling else WAITING_TO_START] += 1
    return [(REMEDIATIONS.name, (MACHINE_REMEDIATION, p), counts[p]) for p in MACHINE_PHASES]


def phase_change(before: Mapping[str, Any], after: remediation_policy.Phase | None) -> str | None:
    """The phase a Metal3Remediation status write enters (None: no change, or none)."""
    if after is None or before.get("phase") == str(after):
        return None
    return str(after)


def entered(
    controller: str, before: Mapping[str, Any], after: remediation_policy.Phase | None
) -> None:
    """Count a written phase change, and the outcome it means."""
    phase = phase_change(before, after)
    if phase is None or after is None:
        return
    PHASE_ENTERED.labels(controller, phase).inc()
    if (outcome := PHASE_OUTCOME.get(after)) is not None:
        OUTCOMES.labels(controller, outcome).inc()


def _stamp(value: Any) -> dt.datetime | None:
    try:
        return parse_stamp(value) if isinstance(value, str) else None
    except ValueError:
        return None


@contextlib.contextmanager
def fencing(controller: str, method: str) -> Iterator[None]:
    """Count one fencing action (a Node deleted or tainted out-of-service) by outcome."""
    try:
        yield
    except Exception:
        FENCES.labels(controller, method, "error").inc()
        raise
    FENCES.labels(controller, method, "success").inc()


SHARD_HOSTS = cache_gauge(
    CacheGauge(
        "metalmend_shard_hosts",
        "BareMetalHosts by the replica of metalmend run that owns them (label"
        ' shard.metalmend.dev/replica), counted by the leader; replica="none": hosts no'
        " live replica owns (unlabelled, or naming a replica whose Lease expired).",
        ("replica",),
    )
)
SHARD_REPLICAS = cache_gauge(
    CacheGauge(
        "metalmend_shard_replicas_live",
        "Replicas of metalmend run whose shard Lease is live, as the leader sees them.",
        (),
    )
)


def shard_samples(hosts: Iterable[Any], live: Iterable[str]) -> list[Sample]:
    """Hosts per live replica (every live replica listed, zeros included) and ``none``;
    a label naming no live replica counts as ``none``, so no host adds a series."""
    members = set(live)
    counts = Tally(
        owner if owner in members else "none"
        for owner in ((h.metadata.labels or {}).get(names.SHARD_REPLICA_LABEL) for h in hosts)
    )
    samples: list[Sample] = [
        (SHARD_HOSTS.name, (member,), float(counts.get(member, 0))) for member in sorted(members)
    ]
    samples.append((SHARD_HOSTS.name, ("none",), float(counts.get("none", 0))))
    samples.append((SHARD_REPLICAS.name, (), float(len(members))))
    return samples
