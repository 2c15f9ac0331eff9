"""Whether the admission policy that guards ``spec.bmc`` is in force, as `metalmend run`
sees it at start and every ``RECHECK`` seconds after.

The BMC credentials model (docs/security.md, "Security model: BMC credentials") binds a
Secret to hosts by name; the binding holds only while nobody but the named writers can
change ``spec.bmc`` of a bound host. That is the ValidatingAdmissionPolicy of
deploy/policies/bmc-spec-writers.yaml (installed by the chart), and its binding. Without
them, anyone who may patch a bound host can point it at a listener of theirs and receive
the Secret's password. metalmend cannot enforce that itself (it sees the change only once
it is stored), so it says so: a log line, a Warning Event in its own namespace, and
``metalmend_admission_policy_missing{policy="metalmend-bmc-spec-writers"} 1``.

Not a readiness failure: the controllers work as well without the policy (the exposure is
in who may write hosts, not in metalmend), and a policy missing in a cluster whose host
writers are all trusted must not take metalmend down.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from prometheus_client import Gauge

from metalmend.kube import errors
from metalmend.kube.events import EventRecorder
from metalmend.log import fields

log = logging.getLogger("metalmend.run")

BMC_SPEC_POLICY = "metalmend-bmc-spec-writers"
"""The policy and binding names of deploy/policies/bmc-spec-writers.yaml (and the chart)."""
REASON = "AdmissionPolicyMissing"
RECHECK = 600.0  # seconds: an operator who installs (or removes) it sees the gauge follow

MISSING = Gauge(
    "metalmend_admission_policy_missing",
    "1 when an admission policy metalmend's security model relies on is not installed or"
    " not bound (Deny); 0 when it is; absent when it could not be read.",
    ["policy"],
)

EXPOSURE = (
    "anyone who may patch a BareMetalHost can change its spec.bmc (address,"
    " disableCertificateVerification) and so send the password of the Secret bound to that"
    " host to an address of their choosing. Install deploy/policies/bmc-spec-writers.yaml"
    " (the chart does, policies.bmcSpecWriters.enabled) and list the identities that may"
    " re-address BMCs"
)


def judge(name: str, installed: bool, binding: Any | None) -> str | None:
    """Why the policy ``name`` guards nothing, from what was read of it (None: installed,
    and bound by the binding of its name with Deny)."""
    if not installed:
        return f"ValidatingAdmissionPolicy {name} is not installed"
    if binding is None:
        return f"ValidatingAdmissionPolicy {name} has no binding {name}"
    spec = binding.spec
    if spec is None or spec.policyName != name:
        return f"ValidatingAdmissionPolicyBinding {name} does not bind policy {name}"
    if "Deny" not in (spec.validationActions or []):
        return f"ValidatingAdmissionPolicyBinding {name} does not Deny (only warns or audits)"
    return None


async def missing(client: AsyncClient, name: str = BMC_SPEC_POLICY) -> str | None:
    """Why the policy ``name`` guards nothing ("" when it could not be read: unknown;
    None when it is installed and bound with Deny)."""
    try:
        await client.get(ValidatingAdmissionPolicy, name)
    except ApiError as error:
        if errors.is_not_found(error):
            return judge(name, False, None)
        return ""
    try:
        binding = await client.get(ValidatingAdmissionPolicyBinding, name)
    except ApiError as error:
        if errors.is_not_found(error):
            return judge(name, True, None)
        return ""
    return judge(name, True, binding)


class PolicyInForce:
    """Whether the policy ``name`` is in force now, from two informers (the policies and
    their bindings, watched): what a controller reads at every decision that trusts a value
    only that policy guards (names.NODE_NAME_POLICY: api/links.node_host). Until both
    informers have listed, nothing is known, and nothing is trusted."""

    def __init__(self, manager: Any, name: str) -> None:
        self.name = name
        self.policies = manager.informer(ValidatingAdmissionPolicy)
        self.bindings = manager.informer(ValidatingAdmissionPolicyBinding)

    def problem(self) -> str:
        """Why it guards nothing ("" when it is in force)."""
        installed = self.policies.store.get(self.name) is not None
        return judge(self.name, installed, self.bindings.store.get(self.name)) or ""

    def concerns(self, old: Any | None, new: Any | None) -> bool:
        """A watch predicate: a change to this policy or its binding."""
        obj = new if new is not None else old
        return obj is not None and obj.metadata.name == self.name


async def check(
    client: AsyncClient, events: EventRecorder, namespace: str, told: str | None = None
) -> str | None:
    """Check once and set the gauge; when the policy is missing and that was not ``told``
    already, say so (log line, Warning Event in ``namespace``). Returns what to pass as
    ``told`` next time."""
    try:
        problem = await missing(client)
    except (httpx2.HTTPError, OSError):
        problem = ""
    if problem == "":  # cannot read it (RBAC, API server): say nothing we do not know
        log.debug("the spec.bmc admission policy could not be read; not checked")
        return told
    MISSING.labels(BMC_SPEC_POLICY).set(1 if problem else 0)
    if problem and problem != told:
        message = f"{problem}: {EXPOSURE}"
        log.warning("admission check: %s", message, extra=fields(policy=BMC_SPEC_POLICY))
        await events.warning(_Subject(namespace), REASON, message)
    return problem


async def keep_checking(
    client: AsyncClient, events: EventRecorder, namespace: str, told: str | None,
    every: float = RECHECK,
) -> None:  # fmt: skip
    """``check`` every ``every`` seconds after the one at start (which found ``told``)."""
    while True:
        await asyncio.sleep(every)
        told = await check(client, events, namespace, told)


class _Subject:
    """What the Event is about: metalmend's Lease in its namespace (the object an operator
    finds beside metalmend; it need not exist for the Event to be listed there)."""

    apiVersion = "coordination.k8s.io/v1"
    kind = "Lease"

    def __init__(self, namespace: str) -> None:
        self.metadata = ObjectMeta(name="metalmend", namespace=namespace, uid="")
