"""The one way metalmend writes to objects it does not fully own.

- Status goes through the status subresource as a JSON merge patch that carries the
  resourceVersion we decided on: if anything changed since, the server answers 409 and
  the controller runtime retries the key with fresh data (a requeue, not an error).
- Annotations and labels are changed by merge patches naming only the keys we own, so a
  concurrent writer's keys are never touched (docs/design.md, invariant 6).
- ``merge_patch`` computes the smallest patch between two JSON documents; an empty one
  means nothing changed and nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.types import PatchType

from metalmend.kube import errors
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


async def delete_exact(
    client: AsyncClient,
    resource: Any,
    name: str,
    uid: str,
    *,
    namespace: str | None = None,
    grace_period: int | None = None,
) -> bool:
    """Delete the object only if it still is the one with ``uid`` (a DeleteOptions
    precondition: a Node that registered again under the same name is not deleted).
    True if deleted now; False if it was already gone or is another object."""
    options: dict[str, Any] = {
        "kind": "DeleteOptions",
        "apiVersion": "v1",
        "preconditions": {"uid": uid},
    }
    if grace_period is not None:
        options["gracePeriodSeconds"] = grace_period
    generic: Any = client._client  # lightkube's delete() cannot carry preconditions
    request = generic.prepare_request("delete", res=resource, name=name, namespace=namespace)
    request.data = options
    response = await generic.send(generic.build_adapter_request(request))
    try:
        generic.handle_response("delete", response, request)
    except ApiError as error:
        # Gone, or a different object by that name (the preconditions did not match).
        if errors.is_not_found(error) or errors.is_conflict(error):
            return False
        raise
    return True
