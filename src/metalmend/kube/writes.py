"""The one way metalmend writes to objects it does not fully own.

- Status goes through the status subresource as a JSON merge patch that carries the
  resourceVersion we decided on: if anything changed since, the server answers 409 and
  the controller runtime retries the key with fresh data (a requeue, not an error).
- Annotations and labels are changed by merge patches naming only the keys we own, so a
  concurrent writer's keys are never touched (DESIGN.md invariant 6).
- ``merge_patch`` computes the smallest patch between two JSON documents; an empty one
  means nothing changed and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.types import PatchType

from metalmend.kube.store import object_key, split_key

_MISSING = object()


def merge_patch(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """RFC 7386 patch turning ``current`` into ``desired`` (None deletes a key)."""
    patch: dict[str, Any] = {}
    for key in current.keys() | desired.keys():
        old, new = current.get(key, _MISSING), desired.get(key, _MISSING)
        if new is _MISSING:
            patch[key] = None
        elif isinstance(old, Mapping) and isinstance(new, Mapping):
            if inner := merge_patch(old, new):
                patch[key] = inner
        elif old != new:
            patch[key] = new
    return patch


def _as_dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


async def patch_status(
    client: AsyncClient, resource: Any, obj: Any, desired_status: Mapping[str, Any]
) -> Any | None:
    """Make ``obj``'s status equal ``desired_status``; return the updated object, or None
    when nothing differed (no request is sent). Raises ApiError 409 if ``obj`` is stale."""
    current = _as_dict(obj).get("status") or {}
    changes = merge_patch(current, desired_status)
    if not changes:
        return None
    body = {"metadata": {"resourceVersion": obj.metadata.resourceVersion}, "status": changes}
    namespace, name = split_key(object_key(obj))
    return await client.patch(
        resource.Status, name, body, namespace=namespace, patch_type=PatchType.MERGE
    )


async def patch_metadata_map(
    client: AsyncClient,
    resource: Any,
    obj: Any,
    field: str,
    changes: Mapping[str, str | None],
    *,
    require_version: bool = False,
) -> Any | None:
    """Set (value) or remove (None) only the named keys of ``metadata.<field>``
    ("annotations" or "labels"). Sends nothing when every key already is as asked."""
    present: Mapping[str, str] = getattr(obj.metadata, field) or {}
    needed = {
        key: value
        for key, value in changes.items()
        if (key in present if value is None else present.get(key) != value)
    }
    if not needed:
        return None
    metadata: dict[str, Any] = {field: needed}
    if require_version:
        metadata["resourceVersion"] = obj.metadata.resourceVersion
    namespace, name = split_key(object_key(obj))
    return await client.patch(
        resource, name, {"metadata": metadata}, namespace=namespace, patch_type=PatchType.MERGE
    )


async def patch_annotations(
    client: AsyncClient, resource: Any, obj: Any, changes: Mapping[str, str | None], **kw: bool
) -> Any | None:
    return await patch_metadata_map(client, resource, obj, "annotations", changes, **kw)


async def patch_labels(
    client: AsyncClient, resource: Any, obj: Any, changes: Mapping[str, str | None], **kw: bool
) -> Any | None:
    return await patch_metadata_map(client, resource, obj, "labels", changes, **kw)
