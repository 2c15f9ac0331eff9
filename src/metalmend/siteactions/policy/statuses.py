"""Shipyard's site statuses and step logs, decided purely (docs/airship-clients.md).

``GET /site_statuses`` (Shipyard's API reference, "Site Statuses") answers, for each
filter asked (``filters=nodes-provision-status,machines-power-state``; none: both), one
list keyed as Shipyard's status helper keys it: ``nodes_provision_status`` (``hostname``,
``status``) and ``machines_powerstate`` (``hostname``, ``power_state``). Shipyard asks
Drydock; here the hosts are the BareMetalHosts of the site's namespaces, their
provisioning state and power as Metal3 reports them.

``GET /actions/{id}/steps/{step}/logs`` answers a step's log as text: Shipyard shows
Airflow's task log; here it is what serve recorded of the step (its notes, in order, and
the executor's record, what a replica taking over continues from).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NODES_PROVISION_STATUS = "nodes-provision-status"
MACHINES_POWER_STATE = "machines-power-state"
FILTERS = (NODES_PROVISION_STATUS, MACHINES_POWER_STATE)
MAX_FILTERS_LENGTH = 256


@dataclass(frozen=True)
class BadFilter:
    message: str


def filters(raw: Sequence[str]) -> tuple[str, ...] | BadFilter:
    """The filters asked (each value comma separated, repeatable), in Shipyard's order;
    none asked: every filter. An unknown one is refused naming the known ones."""
    if sum(len(r) for r in raw) > MAX_FILTERS_LENGTH:
        return BadFilter(f"filters: at most {MAX_FILTERS_LENGTH} characters")
    asked = [part.strip() for value in raw for part in value.split(",") if part.strip()]
    for name in asked:
        if name not in FILTERS:
            return BadFilter(
                f"filter {name[:64]!r} is not supported; supported: {', '.join(FILTERS)}"
            )
    return tuple(f for f in FILTERS if f in asked) if asked else FILTERS


def _power(host: Mapping[str, Any]) -> str:
    powered = (host.get("status") or {}).get("poweredOn")
    return "unknown" if powered is None else ("On" if powered else "Off")


def _provisioning(host: Mapping[str, Any]) -> str:
    state = ((host.get("status") or {}).get("provisioning") or {}).get("state")
    return str(state) if state else "unknown"


def site_statuses(
    wanted: Iterable[str], hosts: Iterable[Mapping[str, Any]]
) -> dict[str, list[dict[str, str]]]:
    """Shipyard's answer for ``wanted`` filters over BareMetalHosts (as the API server
    answers them), sorted by namespace and name."""
    found = sorted(
        hosts,
        key=lambda h: (
            str((h.get("metadata") or {}).get("namespace")),
            str((h.get("metadata") or {}).get("name")),
        ),
    )

    def row(host: Mapping[str, Any], key: str, value: str) -> dict[str, str]:
        meta = host.get("metadata") or {}
        return {
            "hostname": str(meta.get("name")),
            key: value,
            "namespace": str(meta.get("namespace")),
        }

    answer: dict[str, list[dict[str, str]]] = {}
    for name in wanted:
        if name == NODES_PROVISION_STATUS:
            answer["nodes_provision_status"] = [row(h, "status", _provisioning(h)) for h in found]
        elif name == MACHINES_POWER_STATE:
            answer["machines_powerstate"] = [row(h, "power_state", _power(h)) for h in found]
    return answer


def step_log(
    action_id: str,
    step: str,
    state: str,
    try_number: int,
    notes: Iterable[tuple[str | None, str]],
    record: Mapping[str, Any],
) -> str:
    """A step's log as text: a header line, each note (time and text), the record."""
    lines = [f"action {action_id} step {step}: {state} (try {try_number})"]
    lines += [f"{at}  {text}" for at, text in notes]
    if record:
        lines.append("record: " + json.dumps(dict(record), sort_keys=True, default=str))
    return "\n".join(lines) + "\n"
