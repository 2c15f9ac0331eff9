"""The MachineHealthCheck controller: gathers each check's targets (Machines and their
Nodes), asks policy.healthcheck for verdicts, and carries them out:

- remediation by conditions on the Machine (HealthCheckSucceeded=False, OwnerRemediated=False),
  or, with ``remediationTemplate``, by creating an external remediation object (same name
  and namespace as the Machine, ownerReference to it, kind = template kind without
  "Template") and deleting it once the Node is healthy again (Cluster API's machine
  health checking proposal, external remediation);
- the check's status (expectedMachines, currentHealthy, remediationsAllowed, targets,
  conditions) written only when it changed;
- a requeue at the exact next timeout expiry.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from lightkube import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.models.meta_v1 import ObjectMeta, OwnerReference
from lightkube.resources.core_v1 import Node

from metalmend.api import indexes, links, names
from metalmend.api.resources import Machine, MachineHealthCheck, Metal3Remediation
from metalmend.api.selector import matches
from metalmend.api.stamps import parse_stamp, stamp
from metalmend.kube import errors
from metalmend.kube.controller import DONE, Controller, Result, TerminalError
from metalmend.kube.manager import Manager
from metalmend.kube.store import object_key
from metalmend.kube.writes import patch_annotations, patch_status
from metalmend.policy.healthcheck import (
    Check,
    Evaluation,
    InvalidSpec,
    NodeCondition,
    Target,
    check_from_spec,
    evaluate,
)
from metalmend.settings import RequestRemediationBy, Settings

log = logging.getLogger(__name__)


def skipped(obj: Any) -> bool:
    annotations = obj.metadata.annotations or {}
    return names.SKIP_REMEDIATION in annotations or names.PAUSED in annotations


class HealthCheckController:
    def __init__(self, manager: Manager, settings: Settings) -> None:
        self.manager = manager
        self.client = manager.client
        self.clock = manager.clock
        self.events = manager.events
        ns = settings.runtime.namespace
        self.checks = manager.informer(MachineHealthCheck, namespace=ns)
        self.machines = manager.informer(
            Machine, namespace=ns, indexes=indexes.of(indexes.MACHINES_BY_NODE)
        )
        self.nodes = manager.informer(Node)
        self.remediations = manager.informer(Metal3Remediation, namespace=ns)
        self.settings = settings.health_checks

    # ---- observe ----------------------------------------------------------------------

    def selected(self, check: Any) -> list[Any]:
        selector = (check.get("spec") or {}).get("selector") or {}
        ns = check.metadata.namespace
        return [
            m
            for m in self.machines.store.values()
            if m.metadata.namespace == ns and matches(selector, m.metadata.labels)
        ]

    def target(self, machine: Any, existing: set[str] | None) -> Target:
        node_name = next(iter(links.node_of(machine)), None)
        node = self.nodes.store.get(node_name) if node_name else None
        return target_of(machine, node, self.clock.now(), self._remediating(machine, existing))

    def _remediating(self, machine: Any, existing: set[str] | None) -> bool:
        """``existing``: names of the external remediation objects in the Machine's
        namespace (None: remediation by conditions)."""
        if existing is not None:
            return machine.metadata.name in existing
        conditions = (machine.get("status") or {}).get("conditions") or []
        return any(
            c.get("type") == names.CONDITION_OWNER_REMEDIATED and c.get("status") == "False"
            for c in conditions
        )

    # ---- reconcile ----------------------------------------------------------------------

    async def reconcile(self, key: str) -> Result:
        check = self.checks.store.get(key)
        if check is None or skipped(check):
            return DONE
        now = self.clock.now()
        spec = check.get("spec") or {}
        try:
            rules = parse_check(spec)
        except InvalidSpec as error:
            await self._write_status(check, None, str(error), [])
            await self.events.warning(check, names.REASON_INVALID_SPEC, str(error))
            raise TerminalError(f"invalid spec: {error}") from None  # until it is edited
        template = spec.get("remediationTemplate")
        elsewhere = (template or {}).get("namespace")
        if elsewhere and elsewhere != check.metadata.namespace:
            # As Cluster API's webhook: a check may not copy another namespace's template
            # (the CRD cannot say so; its rules do not see metadata.namespace).
            message = (
                f"remediationTemplate.namespace {elsewhere!r} must be empty or this check's"
                f" own namespace {check.metadata.namespace!r}"
            )
            await self._write_status(check, None, message, [])
            await self.events.warning(check, names.REASON_INVALID_SPEC, message)
            raise TerminalError(f"invalid spec: {message}")
        external = await self._template(check, template) if template else None
        if template and external is None:
            message = (
                f"remediation template {template.get('kind')}/{template.get('name')} not found"
            )
            await self._write_status(check, None, message, [])
            await self.events.warning(check, names.REASON_TEMPLATE_NOT_FOUND, message)
            return Result.at(now + dt.timedelta(seconds=self.settings.template_retry))
        machines = [m for m in self.selected(check) if not skipped(m)]
        overlaps = self._overlapping(check, machines)
        by_annotation = not template and self._requests_by_annotation(check)
        if by_annotation:  # metal3's annotation-based remediation: Machines carry the request
            existing: set[str] | None = {
                m.metadata.name
                for m in machines
                if names.EXTERNAL_REMEDIATION in (m.metadata.annotations or {})
            }
        else:
            existing = (
                await self._existing(template, check.metadata.namespace) if template else None
            )
        targets = [self.target(m, existing) for m in machines]
        verdict = evaluate(rules, targets, now)
        by_key = {object_key(m): m for m in machines}
        for machine_key in verdict.remediate:
            if by_annotation:
                await self._annotate(check, by_key[machine_key], verdict)
            else:
                await self._remediate(check, by_key[machine_key], verdict, template, external)
        for machine_key in verdict.withdraw:
            if by_annotation:
                await self._withdraw_annotation(check, by_key[machine_key])
            elif template is not None and external is not None:
                await self._withdraw(check, by_key[machine_key], template)
        await self._mark_healthy(by_key, verdict, external)
        await self._write_status(check, verdict, verdict.spec_error, overlaps)
        if verdict.next_deadline is not None:
            return Result.at(verdict.next_deadline)
        return DONE

    def _requests_by_annotation(self, check: Any) -> bool:
        chosen = (check.metadata.annotations or {}).get(names.REQUEST_REMEDIATION_BY)
        return (chosen or self.settings.request_remediation_by) == RequestRemediationBy.ANNOTATION

    async def _annotate(self, check: Any, machine: Any, verdict: Evaluation) -> None:
        """The machine remediation controller acts on this annotation (metal3's annotation-based
        remediation design)."""
        await patch_annotations(self.client, Machine, machine, {names.EXTERNAL_REMEDIATION: ""})
        reason = verdict.verdicts[object_key(machine)]
        await self.events.normal(
            check,
            names.REASON_REMEDIATION_REQUESTED,
            f"{machine.metadata.name}: {reason.reason}: {reason.message}",
        )

    async def _withdraw_annotation(self, check: Any, machine: Any) -> None:
        await patch_annotations(self.client, Machine, machine, {names.EXTERNAL_REMEDIATION: None})
        await self.events.normal(
            check,
            names.REASON_REMEDIATION_WITHDRAWN,
            f"{machine.metadata.name}: Node healthy again",
        )

    async def _template(self, check: Any, ref: dict[str, Any]) -> Any | None:
        try:
            resource = generic(ref.get("apiVersion", ""), ref.get("kind", ""))
        except ValueError:  # lightkube cannot model it (the CRD now refuses such references)
            return None
        namespace = ref.get("namespace") or check.metadata.namespace
        try:
            return await self.client.get(resource, ref.get("name", ""), namespace=namespace)
        except ApiError as error:
            if errors.is_not_found(error):
                return None
            raise

    async def _existing(self, ref: dict[str, Any], namespace: str) -> set[str]:
        """Names of this template's remediation objects in ``namespace``: from the cache
        for Metal3Remediation, by one list call for any other kind."""
        kind = str(ref.get("kind", "")).removesuffix("Template")
        if kind == "Metal3Remediation":
            return {
                o.metadata.name
                for o in self.remediations.store.values()
                if o.metadata.namespace == namespace
            }
        resource = generic(ref.get("apiVersion", ""), kind)
        return {o.metadata.name async for o in self.client.list(resource, namespace=namespace)}

    def _overlapping(self, check: Any, machines: list[Any]) -> list[str]:
        mine = {object_key(m) for m in machines}
        others = []
        for other in self.checks.store.values():
            if (
                object_key(other) == object_key(check)
                or other.metadata.namespace != check.metadata.namespace
            ):
                continue
            if mine & {object_key(m) for m in self.selected(other)}:
                others.append(other.metadata.name)
        return sorted(others)

    async def _remediate(
        self, check: Any, machine: Any, verdict: Evaluation, ref: Any, template: Any
    ) -> None:
        reason = verdict.verdicts[object_key(machine)]
        message = f"{reason.reason}: {reason.message}"
        if template is None:
            await self._set_machine_conditions(
                machine,
                {
                    names.CONDITION_HEALTH_CHECK_SUCCEEDED: (
                        "False",
                        reason.reason,
                        reason.message,
                    ),
                    names.CONDITION_OWNER_REMEDIATED: ("False", "WaitingForRemediation", message),
                },
            )
        else:
            await self._create_external(machine, ref, template)
        await self.events.normal(
            check, names.REASON_REMEDIATION_REQUESTED, f"{machine.metadata.name}: {message}"
        )

    async def _create_external(self, machine: Any, ref: dict[str, Any], template: Any) -> None:
        kind = str(ref["kind"]).removesuffix("Template")
        resource = generic(ref.get("apiVersion", ""), kind)
        body = ((template.get("spec") or {}).get("template") or {}).get("spec") or {}
        owner = OwnerReference(
            apiVersion="cluster.x-k8s.io/v1beta1",
            kind="Machine",
            name=machine.metadata.name,
            uid=machine.metadata.uid,
        )
        obj = resource(
            metadata=ObjectMeta(
                name=machine.metadata.name,
                namespace=machine.metadata.namespace,
                ownerReferences=[owner],
            ),
            spec=dict(body),
        )
        try:
            await self.client.create(obj)
        except ApiError as error:
            if not errors.is_conflict(error):  # created before: nothing more to do
                raise

    async def _withdraw(self, check: Any, machine: Any, ref: dict[str, Any]) -> None:
        kind = str(ref["kind"]).removesuffix("Template")
        resource = generic(ref.get("apiVersion", ""), kind)
        try:
            await self.client.delete(
                resource, machine.metadata.name, namespace=machine.metadata.namespace
            )
        except ApiError as error:
            if not errors.is_not_found(error):
                raise
        await self.events.normal(
            check,
            names.REASON_REMEDIATION_WITHDRAWN,
            f"{machine.metadata.name}: Node healthy again",
        )

    async def _mark_healthy(
        self, machines: dict[str, Any], verdict: Evaluation, external: Any
    ) -> None:
        for key, result in verdict.verdicts.items():
            if result.kind != "healthy" or key not in machines:
                continue
            # Cluster API's machine health checking proposal: a passing check after a failed
            # one does not update the conditions of a Machine its owner is remediating.
            if external is None and self._remediating(machines[key], None):  # conditions
                continue
            await self._set_machine_conditions(
                machines[key], {names.CONDITION_HEALTH_CHECK_SUCCEEDED: ("True", "", "")}
            )

    async def _set_machine_conditions(
        self, machine: Any, wanted: dict[str, tuple[str, str, str]]
    ) -> None:
        status = dict(machine.get("status") or {})
        conditions = merge_conditions(status.get("conditions") or [], wanted, self.clock.now())
        if conditions != (status.get("conditions") or []):
            status["conditions"] = conditions
            await patch_status(self.client, Machine, machine, status)

    async def _write_status(
        self, check: Any, verdict: Evaluation | None, problem: str, overlaps: list[str]
    ) -> None:
        status = dict(check.get("status") or {})
        wanted: dict[str, tuple[str, str, str]] = {}
        if verdict is not None:
            status.update(
                expectedMachines=verdict.expected,
                currentHealthy=verdict.healthy,
                remediationsAllowed=verdict.remediations_allowed,
                targets=sorted(k.split("/", 1)[1] for k in verdict.verdicts),
            )
            if verdict.allowed:
                wanted[names.CONDITION_REMEDIATION_ALLOWED] = ("True", "", "")
            else:
                reason = names.REASON_INVALID_SPEC if problem else names.REASON_TOO_MANY_UNHEALTHY
                wanted[names.CONDITION_REMEDIATION_ALLOWED] = (
                    "False", reason, problem or verdict.blocked_reason,
                )  # fmt: skip
        else:
            wanted[names.CONDITION_REMEDIATION_ALLOWED] = (
                "False",
                names.REASON_INVALID_SPEC,
                problem,
            )
        if overlaps:
            message = (
                f"Machines also selected by {', '.join(overlaps)}: their verdicts may disagree"
            )
            wanted[names.REASON_OVERLAPPING] = ("True", names.REASON_OVERLAPPING, message)
        status["observedGeneration"] = check.metadata.generation
        previous = {c.get("type"): c for c in status.get("conditions") or []}
        status["conditions"] = merge_conditions(
            status.get("conditions") or [], wanted, self.clock.now()
        )
        if names.REASON_OVERLAPPING in previous and not overlaps:
            status["conditions"] = [
                c for c in status["conditions"] if c["type"] != names.REASON_OVERLAPPING
            ]
        await self._announce(check, previous, wanted, verdict)
        await patch_status(self.client, MachineHealthCheck, check, status)

    async def _announce(
        self,
        check: Any,
        previous: dict[Any, Any],
        wanted: dict[str, tuple[str, str, str]],
        verdict: Evaluation | None,
    ) -> None:
        """One Warning when remediation becomes blocked (and something is unhealthy)."""
        status, reason, message = wanted.get(names.CONDITION_REMEDIATION_ALLOWED, ("", "", ""))
        before = previous.get(names.CONDITION_REMEDIATION_ALLOWED) or {}
        newly_blocked = status == "False" and before.get("status") != "False"
        if newly_blocked and (verdict is None or verdict.unhealthy > 0):
            await self.events.warning(check, reason, message)
        overlap = wanted.get(names.REASON_OVERLAPPING)
        if overlap and names.REASON_OVERLAPPING not in previous:
            await self.events.warning(check, names.REASON_OVERLAPPING, overlap[2])


def merge_conditions(
    current: list[dict[str, Any]], wanted: dict[str, tuple[str, str, str]], now: dt.datetime
) -> list[dict[str, Any]]:
    """``current`` with each wanted (status, reason, message) set; lastTransitionTime moves
    only when the status changes, so an unchanged condition is an unchanged list."""
    by_type = {c.get("type"): dict(c) for c in current}
    for kind, (status, reason, message) in wanted.items():
        old = by_type.get(kind)
        new: dict[str, Any] = {"type": kind, "status": status}
        if reason:
            new["reason"] = reason
        if message:
            new["message"] = message
        if status == "False":
            new["severity"] = "Warning"
        if old is None or old.get("status") != status:
            new["lastTransitionTime"] = stamp(now)
        else:
            new["lastTransitionTime"] = old.get("lastTransitionTime", stamp(now))
        by_type[kind] = new
    return [by_type[k] for k in sorted(by_type, key=str)]


def parse_check(spec: dict[str, Any]) -> Check:
    """The spec as policy.healthcheck reads it; InvalidSpec says what is wrong."""
    return check_from_spec(spec)


def target_of(machine: Any, node: Any | None, now: dt.datetime, remediating: bool) -> Target:
    """What policy.healthcheck reads of a Machine and its Node (None: not found)."""
    conditions: dict[str, NodeCondition] = {}
    for c in (node.status.conditions if node is not None and node.status else None) or []:
        since = c.lastTransitionTime or c.lastHeartbeatTime or now
        conditions[c.type] = NodeCondition(c.status, since)
    lost = (machine.metadata.annotations or {}).get(names.NODE_REF_LOST_AT)
    return Target(
        machine=object_key(machine),
        created=machine.metadata.creationTimestamp or now,
        node_ref=next(iter(links.node_of(machine)), None),
        node_ref_lost=lost_at(lost),
        node_exists=node is not None,
        conditions=conditions,
        remediating=remediating,
    )


def lost_at(annotation: str | None) -> dt.datetime | None:
    """When the Machine lost its nodeRef, from our annotation. Anyone may edit annotations:
    one that does not parse is ignored (startup then counts from creation) rather than
    failing the whole check's reconcile."""
    try:
        return parse_stamp(annotation)
    except (ValueError, OverflowError):
        return None


def generic(api_version: str, kind: str) -> Any:
    group, _, version = api_version.rpartition("/")
    return create_namespaced_resource(group, version, kind, kind.lower() + "s")


def setup(manager: Manager, settings: Settings) -> None:
    controller = HealthCheckController(manager, settings)
    checks = controller.checks

    def checks_in(namespace: str | None) -> list[str]:
        return [object_key(c) for c in checks.store.values() if c.metadata.namespace == namespace]

    def for_machine(old: Any, new: Any) -> list[str]:
        obj = new if new is not None else old
        return checks_in(obj.metadata.namespace)

    def for_node(old: Any, new: Any) -> list[str]:
        node = new if new is not None else old
        keys: set[str] = set()
        for machine in controller.machines.store.by_index(
            indexes.MACHINES_BY_NODE.name, node.metadata.name
        ):
            keys.update(checks_in(machine.metadata.namespace))
        return sorted(keys)

    runner = manager.add(Controller("machine-health-check", controller.reconcile, workers=2))
    runner.watch(checks)
    runner.watch(controller.machines, for_machine)
    runner.watch(controller.nodes, for_node)
    runner.watch(controller.remediations, for_machine)
