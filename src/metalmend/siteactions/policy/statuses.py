"""Shipyard's site statuses and step logs, decided purely (docs/airship-clients.md).

``GET /site_statuses`` (Shipyard's API reference, "Site Statuses") answers, for each
filter asked (``filters=nodes-provision-status,machines-power-state``; none: both), one
list keyed as Shipyard's status helper keys it: ``nodes_provision_status`` (``hostname``,
``status``) and ``machines_powerstate`` (``hostname``, ``power_state``). Shipyard asks
Drydock; here the hosts are the BareMetalHosts of the site's namespaces, their
provisioning state and power as Metal3 reports them, and (metalmend's addition, for a
caller who may list actions) the last action that acted on each.

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


@dataclass(frozen=True)
class ActionSeen:
    """A stored action as the site statuses read it: the nodes it acts on (none: a site
    action, which acts on every host of the site)."""

    id: str  # a ULID: ids sort by creation time
    name: str
    lifecycle: str
    created: str
    targets: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, str]:
        return {
            "id": self.id,
            "name": self.name,
            "action_lifecycle": self.lifecycle,
            "created_at": self.created,
        }


def last_actions(
    hostnames: Iterable[str], actions: Iterable[ActionSeen]
) -> dict[str, ActionSeen | None]:
    """Per host name (its Node's name), the newest action that acted on it: a redeploy or
    relabel naming it in target_nodes, or a site action (deploy_site, update_site)."""
    ordered = sorted(actions, key=lambda a: a.id, reverse=True)
    return {
        name: next((a for a in ordered if not a.targets or name in a.targets), None)
        for name in hostnames
    }


def site_statuses(
    wanted: Iterable[str],
    hosts: Iterable[Mapping[str, Any]],
    actions: Iterable[ActionSeen] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Shipyard's answer for ``wanted`` filters over BareMetalHosts (as the API server
    answers them), sorted by namespace and name. With ``actions`` (the stored actions;
    None: the caller may not list them), each row of ``nodes_provision_status`` also
    carries ``last_action``, the newest action that acted on the host (or null)."""
    found = sorted(
        hosts,
        key=lambda h: (
            str((h.get("metadata") or {}).get("namespace")),
            str((h.get("metadata") or {}).get("name")),
        ),
    )

    def row(host: Mapping[str, Any], key: str, value: str) -> dict[str, Any]:
        meta = host.get("metadata") or {}
        return {
            "hostname": str(meta.get("name")),
            key: value,
            "namespace": str(meta.get("namespace")),
        }

    names = [str((h.get("metadata") or {}).get("name")) for h in found]
    last = last_actions(names, actions) if actions is not None else None

    def provisioned(host: Mapping[str, Any], name: str) -> dict[str, Any]:
        entry = row(host, "status", _provisioning(host))
        if last is not None:
            seen = last.get(name)
            entry["last_action"] = seen.to_wire() if seen is not None else None
        return entry

    answer: dict[str, list[dict[str, Any]]] = {}
    for name in wanted:
        if name == NODES_PROVISION_STATUS:
            answer["nodes_provision_status"] = [
                provisioned(h, n) for h, n in zip(found, names, strict=True)
            ]
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
