"""``metalmend credentials bind``: the migration path to bound BMC Secrets.

Before this version metalmend used any Secret a host named. Now it uses only Secrets
labelled ``metalmend.dev/bmc-credentials: "true"`` whose annotation
``metalmend.dev/bmc-hosts`` names the host (bmc/credentials.py). Run once by an operator
who may read hosts and edit Secrets, ``bind`` labels every Secret that hosts name today
and binds it to exactly those hosts, so existing clusters keep working. Hosts already
bound stay bound (it only adds), and ``*`` is kept. Review its plan with ``--dry-run``
first: binding what hosts name today trusts whoever created those hosts.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

from lightkube import ApiError, Client
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.bmc.credentials import (
    EVERY_HOST,
    HOSTS_ANNOTATION,
    SECRET_LABEL,
    SECRET_LABEL_VALUE,
    binding_value,
    bound_hosts,
)
from metalmend.kube import errors


@dataclass(frozen=True)
class Binding:
    """What ``bind`` does (or, in a dry run, would do) to one Secret."""

    namespace: str
    secret: str
    hosts: tuple[str, ...]  # the hosts naming it now
    before: str  # binding annotation before ("" if none)
    after: str  # binding annotation after
    labelled: bool  # already carried the label
    problem: str = ""  # why it was left alone (missing Secret, no access)
    resource_version: str = ""  # of the Secret read: a concurrent edit makes the patch fail

    @property
    def changes(self) -> bool:
        return not self.problem and (not self.labelled or self.before != self.after)

    def describe(self, dry_run: bool) -> str:
        where = f"{self.namespace}/{self.secret}"
        if self.problem:
            return f"{where}: skipped, {self.problem} (named by {', '.join(self.hosts)})"
        if not self.changes:
            return f"{where}: already labelled and bound to {self.after}"
        verb = "would bind" if dry_run else "bound"
        label = "" if self.labelled else f", label {SECRET_LABEL}={SECRET_LABEL_VALUE} added"
        was = f" (was: {self.before})" if self.before else ""
        return f"{where}: {verb} to {self.after}{was}{label}"


def plan(hosts: list[Any], secrets: dict[tuple[str, str], Any | str]) -> list[Binding]:
    """The bindings for ``hosts``, given each named Secret (or why it cannot be read)."""
    naming: dict[tuple[str, str], set[str]] = defaultdict(set)
    for host in hosts:
        name = ((host.get("spec") or {}).get("bmc") or {}).get("credentialsName")
        if name and "/" not in name:  # another namespace's Secret is refused anyway
            naming[(str(host.metadata.namespace), name)].add(str(host.metadata.name))
    bindings = []
    for (namespace, secret_name), names in sorted(naming.items()):
        secret = secrets.get((namespace, secret_name), "not found")
        ordered = tuple(sorted(names))
        if isinstance(secret, str):
            bindings.append(Binding(namespace, secret_name, ordered, "", "", False, secret))
            continue
        meta = secret.metadata
        before = (meta.annotations or {}).get(HOSTS_ANNOTATION, "")
        current = bound_hosts(meta.annotations)
        after = EVERY_HOST if EVERY_HOST in current else binding_value(current | names)
        labelled = (meta.labels or {}).get(SECRET_LABEL) == SECRET_LABEL_VALUE
        version = str(meta.resourceVersion or "")
        bindings.append(
            Binding(namespace, secret_name, ordered, before, after, labelled, "", version)
        )
    return bindings


def bind(client: Client, namespace: str | None, *, dry_run: bool) -> list[Binding]:
    """Label and bind every Secret named by the hosts of ``namespace`` (None: all)."""
    hosts: list[Any] = list(client.list(BareMetalHost, namespace=namespace or "*"))
    secrets: dict[tuple[str, str], Any | str] = {}
    for host in hosts:
        name = ((host.get("spec") or {}).get("bmc") or {}).get("credentialsName")
        key = (str(host.metadata.namespace), str(name))
        if not name or "/" in name or key in secrets:
            continue
        try:
            secrets[key] = client.get(Secret, name, namespace=key[0])
        except ApiError as error:
            secrets[key] = (
                "not found"
                if errors.is_not_found(error)
                else f"cannot read it ({errors.code(error)})"
            )
    bindings = plan(hosts, secrets)
    if dry_run:
        return bindings
    done = []
    for binding in bindings:
        if binding.changes:
            patch = {
                "metadata": {
                    "labels": {SECRET_LABEL: SECRET_LABEL_VALUE},
                    "annotations": {HOSTS_ANNOTATION: binding.after},
                    # the version read: an edit since then is not overwritten (409)
                    "resourceVersion": binding.resource_version,
                }
            }
            try:
                client.patch(
                    Secret, binding.secret, patch,
                    namespace=binding.namespace, patch_type=PatchType.MERGE,
                )  # fmt: skip
            except ApiError as error:
                why = (
                    "changed meanwhile, run again"
                    if errors.is_conflict(error)
                    else f"cannot patch ({errors.code(error)})"
                )
                binding = replace(binding, problem=why)
        done.append(binding)
    return done
