"""Prometheus metrics of BMC calls, served on ``metalmend run``'s /metrics.

Every call through ``BmcPool`` (the one door to the BMCs) is timed and counted by
protocol, operation and outcome. The labels are bounded on purpose: a protocol is one of
``ipmi``/``redfish``, an operation one of ``OPERATIONS``, an outcome ``success`` or one of
``ERRORS``. Host names, BMC addresses and error texts never become labels: 5,000 hosts
would make 5,000 series per bucket, and an address in a label outlives the host. Which
host fails is on the host (status.errorMessage, Events); /metrics says how many and how
often.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum

from prometheus_client import Counter, Gauge, Histogram

from metalmend.api.power import PowerAction
from metalmend.bmc import errors


class Operation(StrEnum):
    """What a BMC call asks (the ``operation`` label)."""

    POWER_STATE = "power_state"
    POWER_ON = "power_on"
    POWER_OFF_SOFT = "power_off_soft"
    POWER_OFF_HARD = "power_off_hard"
    DRIVES = "drives"
    START_ERASE = "start_erase"
    ERASE_STATUS = "erase_status"


OPERATIONS = tuple(Operation)

ACTION_OPERATION = {
    PowerAction.ON: Operation.POWER_ON,
    PowerAction.SOFT_OFF: Operation.POWER_OFF_SOFT,
    PowerAction.HARD_OFF: Operation.POWER_OFF_HARD,
}

SUCCESS = "success"
# The error kinds (the ``error``/``outcome`` label), most specific class first.
ERRORS: tuple[tuple[type[BaseException], str], ...] = (
    (errors.TimedOut, "timeout"),
    (TimeoutError, "timeout"),
    (errors.Unreachable, "unreachable"),
    (errors.AuthenticationFailed, "auth"),
    (errors.CredentialsError, "credentials"),
    (errors.Refused, "refused_by_policy"),
    (errors.BadAddress, "bad_address"),
    (errors.Unsupported, "unsupported"),
    (errors.BmcError, "failed"),
)
CANCELLED = "cancelled"
OTHER = "other"

PROTOCOLS = ("ipmi", "redfish")


def operation_of(action: PowerAction) -> Operation:
    return ACTION_OPERATION[action]


def outcome_of(error: BaseException | None) -> str:
    """The outcome label of a call that raised ``error`` (None: it succeeded)."""
    if error is None:
        return SUCCESS
    if isinstance(error, errors.Busy):
        return "busy"
    for kind, label in ERRORS:
        if isinstance(error, kind):
            return label
    if isinstance(error, asyncio.CancelledError):
        return CANCELLED
    return OTHER


def protocol_label(protocol: str) -> str:
    """The protocol label: a scheme variant (``redfish+https``, ``idrac-redfish``) counts
    as its protocol; anything unknown as ``other``, so no input can add a series."""
    lowered = protocol.lower()
    for known in PROTOCOLS:
        if known in lowered:
            return known
    return OTHER


REQUEST_SECONDS = Histogram(
    "metalmend_bmc_request_duration_seconds",
    "Time of one BMC call, from its slot being taken to its answer (or its end at the"
    " deadline), by protocol, operation and outcome.",
    ["protocol", "operation", "outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1, 2.5, 5, 10, 30),
)
REQUEST_ERRORS = Counter(
    "metalmend_bmc_request_errors_total",
    "BMC calls that failed, by protocol, operation and kind of error.",
    ["protocol", "operation", "error"],
)
BUSY = Counter(
    "metalmend_bmc_busy_total",
    "BMC calls not started because their BMC, tenant share or the pool was busy (the host"
    " is tried again shortly; nothing was sent).",
    ["protocol", "operation"],
)
IN_FLIGHT = Gauge("metalmend_bmc_requests_in_flight", "BMC calls under way now.")
IPMI_WORKER_STARTS = Counter(
    "metalmend_bmc_ipmi_worker_starts_total",
    "IPMI worker processes started (the first ones, and each replacement of a worker killed"
    " at a call's deadline or crashed).",
)

# The refusals an alert watches (docs/runbooks.md) exist from the start at 0, so that
# increase() sees the first one.
for _protocol in PROTOCOLS:
    for _operation in OPERATIONS:
        for _kind in ("auth", "credentials"):
            REQUEST_ERRORS.labels(_protocol, _operation, _kind)


def observe(
    protocol: str, operation: Operation, seconds: float, error: BaseException | None
) -> None:
    """Record one call that ran (held its slots)."""
    proto, outcome = protocol_label(protocol), outcome_of(error)
    REQUEST_SECONDS.labels(proto, operation, outcome).observe(seconds)
    if outcome not in (SUCCESS, CANCELLED):  # a caller giving up is no fault of the BMC
        REQUEST_ERRORS.labels(proto, operation, outcome).inc()


def turned_away(protocol: str, operation: Operation) -> None:
    BUSY.labels(protocol_label(protocol), operation).inc()
