"""Does the served BareMetalHost schema keep the status fields metalmend relies on?

metalmend's host-power writes the reboot API's timestamps and its own power facts into a
BareMetalHost's status, and remediation's fencing reads them back (policy/fencing.py). Our
CRD (deploy/crds) declares them. Upstream baremetal-operator's CRD is a structural schema
without them, so the API server silently prunes them on every write: reboots would never
be seen as done, and fencing would never see the evidence it waits for. So ``metalmend
run`` refuses, at start, to run those controllers against such a schema, naming the fields
(docs/install.md, "Beside metal3").

The schema is read from the API server's OpenAPI v3 document of ``metal3.io/v1alpha1``,
which every authenticated identity may read (the ``system:discovery`` role): no RBAC of
its own, unlike reading the CustomResourceDefinition.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import httpx2
from lightkube import AsyncClient

from metalmend.log import fields

log = logging.getLogger(__name__)

OPENAPI_PATH = "/openapi/v3/apis/metal3.io/v1alpha1"
BARE_METAL_HOST = "io.metal3.v1alpha1.BareMetalHost"

# Written by host-power (policy/hostpower.py, the status it keeps).
HOST_POWER_FIELDS = (
    "status.poweredOn",
    "status.lastPowerCommand",
    "status.poweredOffFor",
    "status.provisioning.lastPoweredOn",
    "status.provisioning.pendingRebootSince",
)
# Read by fencing before a Node is deleted (policy/fencing.py): without them no remediation
# ever fences, it waits for evidence that cannot be stored.
FENCING_FIELDS = ("status.poweredOn", "status.lastPowerCommand", "status.poweredOffFor")
NEEDED_BY = {
    "host-power": HOST_POWER_FIELDS,
    "metal3-remediation": FENCING_FIELDS,
    "fence-remediation": FENCING_FIELDS,
    "machine-remediation": FENCING_FIELDS,
}


def needed_fields(controllers: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The status fields each of ``controllers`` needs kept, for those that need any."""
    return {name: NEEDED_BY[name] for name in controllers if name in NEEDED_BY}


def pruned(schema: Mapping[str, Any], paths: Iterable[str]) -> list[str]:
    """The dotted ``paths`` that a structural ``schema`` (an OpenAPI v3 object schema, $refs
    resolved through ``components``) would prune: a field survives when every object on its
    way declares the next name, or keeps unknown fields."""
    return [path for path in paths if not _kept(schema, path.split("."))]


def _kept(node: Mapping[str, Any], names: list[str]) -> bool:
    for name in names:
        if node.get("x-kubernetes-preserve-unknown-fields") is True:
            return True
        child = (node.get("properties") or {}).get(name)
        if not isinstance(child, Mapping):
            return False
        node = child
    return True


def resolve(document: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` with ``$ref`` and single-entry ``allOf`` ($ref wrappers the API server
    publishes for nested types) replaced by what they point to, recursively."""
    schemas = (document.get("components") or {}).get("schemas") or {}

    def walk(value: Any, seen: frozenset[str]) -> Any:
        if isinstance(value, Mapping):
            ref = value.get("$ref")
            if isinstance(ref, str) and ref.rpartition("/")[2] not in seen:
                name = ref.rpartition("/")[2]
                return walk(schemas.get(name) or {}, seen | {name})
            all_of = value.get("allOf")
            if isinstance(all_of, list) and len(all_of) == 1:
                merged = {k: v for k, v in value.items() if k != "allOf"}
                return walk({**all_of[0], **merged}, seen)
            return {k: walk(v, seen) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v, seen) for v in value]
        return value

    resolved: dict[str, Any] = walk(node, frozenset())
    return resolved


async def served_bare_metal_host_schema(client: AsyncClient) -> dict[str, Any] | None:
    """The BareMetalHost schema the API server serves, or None when it cannot tell (the
    kind is not served yet, the server is unreachable, or it publishes no OpenAPI v3)."""
    generic: Any = client._client  # lightkube has no OpenAPI call; its HTTP client has
    try:
        response = await generic._client.get(OPENAPI_PATH)
        if response.is_error:
            log.debug("no OpenAPI v3 for metal3.io", extra=fields(code=response.status_code))
            return None
        document = response.json()
    except (httpx2.HTTPError, OSError, ValueError) as error:
        log.debug("OpenAPI v3 unreadable", extra=fields(error=str(error)))
        return None
    schema = ((document.get("components") or {}).get("schemas") or {}).get(BARE_METAL_HOST)
    return resolve(document, schema) if isinstance(schema, Mapping) else None


def refusal(missing: Mapping[str, list[str]]) -> str:
    """One line for the operator: which controllers cannot run, and which fields are pruned."""
    controllers = ", ".join(missing)
    lost = sorted({f for names in missing.values() for f in names})
    return (
        f"the served BareMetalHost schema (metal3.io/v1alpha1) has no {', '.join(lost)}:"
        f" the API server would drop these fields, which {controllers} rely on (upstream"
        " baremetal-operator's CRD). Install metalmend's CRD (deploy/crds) where metalmend"
        " manages power, or beside baremetal-operator run without host-power,"
        " metal3-remediation and machine-remediation (docs/install.md, 'Beside metal3')"
    )


async def check(client: AsyncClient, controllers: Iterable[str]) -> str | None:
    """None when the controllers' status fields are kept (or there is nothing to check, or
    the schema cannot be read now); else the refusal line."""
    needed = needed_fields(controllers)
    if not needed:
        return None
    schema = await served_bare_metal_host_schema(client)
    if schema is None:
        log.warning("could not read the served BareMetalHost schema; not checked")
        return None
    missing = {name: lost for name, paths in needed.items() if (lost := pruned(schema, paths))}
    return refusal(missing) if missing else None
