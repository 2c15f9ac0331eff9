"""The narrow interface every executor writes through (docs/decide-act.md).

An executor carries a policy's decision out; everything it changes in the world goes
through a ``Writer``: status and metadata patches, exact deletes, creating an object, a
power command to a BMC, an Event. ``KubeWriter`` is the real one (the API server through
kube.writes, the BMCs through the pool). The hypothesis state machines implement the same
protocol over their simulated world, so they drive the real executors: a change to an
executor is a change to the model that proves it safe.

Every method is idempotent in the sense the controllers rely on: asking for what already
is sends nothing (patches) or succeeds quietly (deleting what is gone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from lightkube import ALL_NS, ApiError, AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from metalmend.api.power import PowerAction
from metalmend.kube import errors, writes
from metalmend.kube.events import EventRecorder
from metalmend.kube.store import object_key, split_key


class PowerSender(Protocol):
    """What a writer needs of the BMC pool (bmc.pool.BmcPool): one call."""

    async def act(self, target: Any, action: PowerAction) -> None: ...


class Writer(Protocol):
    async def patch_status(self, resource: Any, obj: Any, status: Mapping[str, Any]) -> Any | None:
        """Make ``obj``'s status equal ``status``, conditional on the resourceVersion of
        ``obj`` (a conflict raises). Returns the new object, None if nothing differed."""

    async def patch_metadata(
        self,
        resource: Any,
        obj: Any,
        field: str,
        changes: Mapping[str, str | None],
        *,
        require_version: bool = False,
    ) -> Any | None:
        """Set (value) or remove (None) only the named keys of ``metadata.<field>``
        ("labels" or "annotations"); ``require_version``: only if ``obj`` is unchanged."""

    async def set_finalizers(
        self, resource: Any, obj: Any, finalizers: Sequence[str]
    ) -> Any | None:
        """``metadata.finalizers``, conditional on ``obj``'s resourceVersion. None when the
        object is gone (removing the last finalizer of an object being deleted)."""

    async def set_taints(self, node: Any, taints: Sequence[Mapping[str, str]]) -> Any | None:
        """A Node's ``spec.taints``, conditional on its resourceVersion."""

    async def delete_exact(
        self, resource: Any, name: str, uid: str, *, namespace: str | None = None
    ) -> bool:
        """Delete the object only if it still has ``uid``; True if deleted now."""

    async def delete_pods_on(self, node: str) -> None:
        """Delete at once the pods bound to ``node`` (a fenced Node: nothing of them runs)."""

    async def create(self, resource: Any, obj: Any) -> Any:
        """Create ``obj``; an object of that name already there is not an error (returns
        None): creation is idempotent for executors that name what they create."""

    async def power(self, target: Any, action: PowerAction) -> None:
        """Send ``action`` to the BMC of ``target`` (raises the pool's BmcError)."""

    async def record_event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        """A Kubernetes Event on ``obj`` (never raises: a courtesy, not state)."""


class KubeWriter:
    """The real writer: the API server and the BMCs."""

    def __init__(
        self, client: AsyncClient, events: EventRecorder, bmcs: PowerSender | None = None
    ) -> None:
        self.client = client
        self.events = events
        self.bmcs = bmcs

    async def patch_status(self, resource: Any, obj: Any, status: Mapping[str, Any]) -> Any | None:
        return await writes.patch_status(self.client, resource, obj, status)

    async def patch_metadata(
        self,
        resource: Any,
        obj: Any,
        field: str,
        changes: Mapping[str, str | None],
        *,
        require_version: bool = False,
    ) -> Any | None:
        return await writes.patch_metadata_map(
            self.client, resource, obj, field, changes, require_version=require_version
        )

    async def set_finalizers(
        self, resource: Any, obj: Any, finalizers: Sequence[str]
    ) -> Any | None:
        if list(obj.metadata.finalizers or []) == list(finalizers):
            return None
        body = {
            "metadata": {
                "finalizers": list(finalizers),
                "resourceVersion": obj.metadata.resourceVersion,
            }
        }
        namespace, name = split_key(object_key(obj))
        try:
            return await self.client.patch(
                resource, name, body, namespace=namespace, patch_type=PatchType.MERGE
            )
        except ApiError as error:
            if errors.is_not_found(error) and not finalizers:
                return None  # the last finalizer removed: the object is gone
            raise

    async def set_taints(self, node: Any, taints: Sequence[Mapping[str, str]]) -> Any | None:
        body = {
            "metadata": {"resourceVersion": node.metadata.resourceVersion},
            "spec": {"taints": [dict(t) for t in taints]},
        }
        return await self.client.patch(Node, node.metadata.name, body, patch_type=PatchType.MERGE)

    async def delete_exact(
        self, resource: Any, name: str, uid: str, *, namespace: str | None = None
    ) -> bool:
        return await writes.delete_exact(self.client, resource, name, uid, namespace=namespace)

    async def delete_pods_on(self, node: str) -> None:
        # Pods are not cached (there may be very many); the fenced Node's are listed once.
        async for pod in self.client.list(Pod, namespace=ALL_NS, fields={"spec.nodeName": node}):
            namespace, name = split_key(object_key(pod))
            try:
                await self.client.delete(Pod, name, namespace=namespace, grace_period=0)
            except ApiError as error:
                if not errors.is_not_found(error):
                    raise

    async def create(self, resource: Any, obj: Any) -> Any:
        del resource  # the object carries its kind
        try:
            return await self.client.create(obj)
        except ApiError as error:
            if errors.is_conflict(error):  # created before (409 AlreadyExists)
                return None
            raise

    async def power(self, target: Any, action: PowerAction) -> None:
        if self.bmcs is None:
            raise RuntimeError("this writer has no BMC pool")  # a wiring bug, not input
        await self.bmcs.act(target, action)

    async def record_event(self, obj: Any, type_: str, reason: str, message: str) -> None:
        await self.events.record(obj, type_, reason, message)
