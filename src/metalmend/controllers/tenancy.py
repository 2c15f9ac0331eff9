"""Telling a Machine that a link was refused (api/links.py): a condition on the Machine, a
Warning Event and one log line, each once per refusal (on the condition's transition, not on
every reconcile), and the condition back to True once the cause is gone."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from metalmend.api import indexes, links, names
from metalmend.api.links import REASON_VALID
from metalmend.api.resources import machine_resource
from metalmend.api.stamps import stamp
from metalmend.clock import Clock
from metalmend.kube import admission
from metalmend.kube.store import object_key
from metalmend.kube.writer import Writer
from metalmend.log import fields

log = logging.getLogger(__name__)


def wanted_condition(
    current: dict[str, Any] | None, type_: str, refusal: str, reason: str, now: str
) -> dict[str, Any] | None:
    """The condition to write, or None to leave things as they are: a refusal is recorded
    as False; no refusal turns an existing False back to True and otherwise writes nothing
    (a Machine that was never refused carries no such condition: no write per Machine)."""
    if refusal:
        wanted = {
            "type": type_,
            "status": "False",
            "severity": "Warning",
            "reason": reason,
            "message": refusal,
        }
    elif current is None or current.get("status") == "True":
        return None
    else:
        wanted = {"type": type_, "status": "True", "reason": REASON_VALID}
    same = {k: v for k, v in (current or {}).items() if k != "lastTransitionTime"}
    if same == wanted:
        return None
    changed = current is None or current.get("status") != wanted["status"]
    previous = (current or {}).get("lastTransitionTime")
    wanted["lastTransitionTime"] = now if changed or not previous else previous
    return wanted


async def report(
    writer: Writer,
    clock: Clock,
    machine: Any,
    type_: str,
    refusal: str,
    reason: str,
) -> Any | None:
    """Make the Machine's ``type_`` condition say ``refusal`` ("" = nothing refused); return
    the updated Machine if it was written."""
    status = dict(machine.get("status") or {})
    conditions = [dict(c) for c in status.get("conditions") or []]
    current = next((c for c in conditions if c.get("type") == type_), None)
    wanted = wanted_condition(current, type_, refusal, reason, stamp(clock.now()))
    if wanted is None:
        return None
    status["conditions"] = [c for c in conditions if c.get("type") != type_] + [wanted]
    updated = await writer.patch_status(machine_resource(machine), machine, status)
    if refusal:
        # Once per refusal: a reconcile that finds the same condition writes nothing above.
        log.warning("link refused", extra=fields(machine=object_key(machine), reason=reason,
                                                 message=refusal))  # fmt: skip
        await writer.record_event(machine, "Warning", reason, refusal)
    return updated


def node_host_of(
    node: Any,
    hosts: Any,
    guard: admission.PolicyInForce,
    openshift_machine: Callable[[str], Any | None] | None = None,
) -> links.NodeHost:
    """The host of a Node without a Machine of its own remediation, as its hosts confirm it
    (api/links.node_host), from the hosts informer (indexed by indexes.HOSTS_BY_NODE and
    HOSTS_BY_UID; ``guard``: whether names.NODE_NAME_POLICY guards the hosts' word on their
    Node); and, where OpenShift's Machines are read (``openshift_machine``: the one of that
    "namespace/name", or None), through the Machine the Node's
    ``machine.openshift.io/machine`` annotation names, as that Machine and its host confirm
    it (api/links.node_host_confirmed)."""
    provider = links.node_provider_id(node)
    name = node.metadata.name
    naming = [links.host_facts(h) for h in hosts.store.by_index(indexes.HOSTS_BY_NODE.name, name)]
    uid = links.node_uid_ref(provider)
    found = hosts.store.by_index(indexes.HOSTS_BY_UID.name, uid) if uid else []
    by_uid = links.host_facts(found[0]) if len(found) == 1 else None
    annotations = node.metadata.annotations or {}
    direct = links.node_host(
        name, provider, naming, by_uid, annotations.get(names.NODE_HOST), guard.problem()
    )
    key = links.node_machine_key(annotations)
    if key is None or openshift_machine is None:
        return direct
    machine = openshift_machine(key)
    facts = links.node_machine_facts(machine) if machine is not None else None

    def host(host_key: str) -> links.HostFacts | None:
        obj = hosts.store.get(host_key)
        return links.host_facts(obj) if obj is not None else None

    via = links.node_host_through_machine(name, provider, key, facts, host)
    return links.node_host_confirmed(name, direct, key, via, naming)
