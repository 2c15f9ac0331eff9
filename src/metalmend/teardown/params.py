"""The Promenade node-teardown requests, read and checked (no I/O): query parameters,
their defaults, and the design reference, exactly as Airship's node teardown spec gives
them (airship-specs ``specs/approved/workflow_node-teardown.rst``). A request that cannot
work raises ``RequestRejected``, answered 400 with its reason (BadRequest, or
MissingDesignRef for the etcd health request without ``design_ref``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from metalmend.designs import designref
from metalmend.designs.designref import DesignRef

# The spec's defaults, in seconds.
DRAIN_TIMEOUT = 3600
DRAIN_GRACE_PERIOD = 1800
CLEAR_LABELS_TIMEOUT = 1800
REMOVE_ETCD_TIMEOUT = 1800
ETCD_READY_TIMEOUT = 600

# Longer than any step should take, short enough that a deadline computed from it stays a
# date (a number of 40 digits is a typo, answered as one).
MAX_SECONDS = 7 * 24 * 3600

Query = Sequence[tuple[str, str]]

# A Node's name is a DNS subdomain (RFC 1123): what the API server accepts.
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_WHOLE = re.compile(r"[0-9]+")


class RequestRejected(ValueError):
    def __init__(self, message: str, reason: str = "BadRequest") -> None:
        super().__init__(message)
        self.message = message
        self.reason = reason


@dataclass(frozen=True)
class DrainRequest:
    timeout: int = DRAIN_TIMEOUT
    grace_period: int = DRAIN_GRACE_PERIOD


@dataclass(frozen=True)
class ClearLabelsRequest:
    timeout: int = CLEAR_LABELS_TIMEOUT


@dataclass(frozen=True)
class RemoveEtcdRequest:
    design_ref: DesignRef
    timeout: int = REMOVE_ETCD_TIMEOUT


@dataclass(frozen=True)
class DecommissionRequest:
    design_ref: DesignRef
    drain: DrainRequest
    clear_labels: ClearLabelsRequest
    remove_etcd_timeout: int = REMOVE_ETCD_TIMEOUT
    etcd_ready_timeout: int = ETCD_READY_TIMEOUT


def node_name(raw: str) -> str:
    if len(raw) > 253 or not _NODE_NAME.fullmatch(raw):
        raise RequestRejected(
            f"{raw[:100]!r} is not a Node name (lower-case letters, digits, '-' and '.')"
        )
    return raw


def _values(query: Query, known: Sequence[str]) -> dict[str, str]:
    """The query as a mapping; unknown or repeated parameters are refused, so that a typo
    (``grace_period``) is not silently the default."""
    found: dict[str, str] = {}
    for name, value in query:
        if name not in known:
            listed = ", ".join(known) if known else "none"
            raise RequestRejected(f"unknown query parameter {name!r} (known: {listed})")
        if name in found:
            raise RequestRejected(f"query parameter {name!r} is given more than once")
        found[name] = value
    return found


def whole_number(name: str, raw: str | None, default: int) -> int:
    """A whole number of seconds, as the spec asks for every timeout and grace period."""
    if raw is None:
        return default
    if not _WHOLE.fullmatch(raw):
        raise RequestRejected(f"{name} must be a whole number of seconds, not {raw[:40]!r}")
    value = int(raw)
    if value > MAX_SECONDS:
        raise RequestRejected(f"{name} must be at most {MAX_SECONDS} seconds, not {value}")
    return value


def _drain(timeout: int, grace_period: int, names: tuple[str, str]) -> DrainRequest:
    if grace_period >= timeout:
        raise RequestRejected(
            f"{names[1]} ({grace_period} s) must be less than {names[0]} ({timeout} s):"
            " pods could not be given their grace period before the drain gives up"
        )
    return DrainRequest(timeout, grace_period)


def drain(query: Query) -> DrainRequest:
    """``POST /nodes/{node_id}/drain?timeout=&grace-period=`` (no body)."""
    values = _values(query, ("timeout", "grace-period"))
    return _drain(
        whole_number("timeout", values.get("timeout"), DRAIN_TIMEOUT),
        whole_number("grace-period", values.get("grace-period"), DRAIN_GRACE_PERIOD),
        ("timeout", "grace-period"),
    )


def clear_labels(query: Query) -> ClearLabelsRequest:
    """``POST /nodes/{node_id}/clear-labels?timeout=`` (no body)."""
    values = _values(query, ("timeout",))
    return ClearLabelsRequest(whole_number("timeout", values.get("timeout"), CLEAR_LABELS_TIMEOUT))


def no_parameters(query: Query) -> None:
    """``shutdown-kubelet`` and ``remove-from-cluster`` take none."""
    _values(query, ())


def design_ref_url(raw: str) -> DesignRef:
    """A design reference (``designs.designref``): a revision of serve's design store, or an
    https URL (allowed or not: the settings say, when it is read). Never echoed as given."""
    try:
        return designref.parse(raw)
    except designref.ReferenceRefused as error:
        raise RequestRejected(str(error)) from None


def design_ref_body(document: object) -> DesignRef:
    """The request body ``{rel: "design", href: "...", type: "application/x-yaml"}``,
    already parsed (JSON, or the YAML flow mapping the spec writes it as)."""
    if not isinstance(document, dict):
        raise RequestRejected(
            'the body must be a design reference: {"rel": "design", "href": "deckhand+https://'
            '...", "type": "application/x-yaml"}'
        )
    rel = document.get("rel", "design")
    if rel != "design":
        raise RequestRejected(f'the design reference\'s rel must be "design", not {rel!r}')
    href = document.get("href")
    if not isinstance(href, str) or not href.strip():
        raise RequestRejected("the design reference has no href")
    kind = document.get("type", "application/x-yaml")
    if kind != "application/x-yaml":
        raise RequestRejected(
            f'the design reference\'s type must be "application/x-yaml", not {kind!r}'
        )
    return design_ref_url(href)


def remove_etcd(query: Query, document: object) -> RemoveEtcdRequest:
    """``POST /nodes/{node_id}/remove-etcd?timeout=`` with the design reference."""
    values = _values(query, ("timeout",))
    timeout = whole_number("timeout", values.get("timeout"), REMOVE_ETCD_TIMEOUT)
    return RemoveEtcdRequest(design_ref_body(document), timeout)


DECOMMISSION_PARAMETERS = (
    "drain-node-timeout",
    "drain-node-grace-period",
    "clear-labels-timeout",
    "remove-etcd-timeout",
    "etcd-ready-timeout",
)


def decommission(query: Query, document: object) -> DecommissionRequest:
    """``POST /nodes/{node_id}/decommission`` with the design reference; a step whose
    parameter is absent uses its own default, and the drain's grace period must be less
    than its timeout as they will be used."""
    values = _values(query, DECOMMISSION_PARAMETERS)

    def number(name: str, default: int) -> int:
        return whole_number(name, values.get(name), default)

    return DecommissionRequest(
        design_ref=design_ref_body(document),
        drain=_drain(
            number("drain-node-timeout", DRAIN_TIMEOUT),
            number("drain-node-grace-period", DRAIN_GRACE_PERIOD),
            ("drain-node-timeout", "drain-node-grace-period"),
        ),
        clear_labels=ClearLabelsRequest(number("clear-labels-timeout", CLEAR_LABELS_TIMEOUT)),
        remove_etcd_timeout=number("remove-etcd-timeout", REMOVE_ETCD_TIMEOUT),
        etcd_ready_timeout=number("etcd-ready-timeout", ETCD_READY_TIMEOUT),
    )


def etcd_health(query: Query) -> DesignRef:
    """``GET /etcd-cluster-health-statuses?design_ref=...``: 400 MissingDesignRef without it."""
    values = _values(query, ("design_ref",))
    raw = values.get("design_ref", "").strip()
    if not raw:
        raise RequestRejected(
            "design_ref is required: the design reference that locates the etcd clusters",
            reason="MissingDesignRef",
        )
    return design_ref_url(raw)
