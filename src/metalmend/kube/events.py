"""Kubernetes Events, aggregated: the same (object, type, reason, message) recorded again
bumps ``count`` and ``lastTimestamp`` of one Event instead of creating another.

The Event's name is derived from what it says, so aggregation survives a restart of the
controller. Recording never raises: an Event that cannot be written is logged and dropped,
because an Event is a courtesy to the operator, not state.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections import OrderedDict
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.log import fields

log = logging.getLogger(__name__)

_REMEMBERED = 4096  # events whose count we keep in memory; older ones are read back
NORMAL = "Normal"
WARNING = "Warning"


class EventRecorder:
    def __init__(
        self, client: AsyncClient, component: str = "metalmend", clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.client = client
        self.component = component
        self.instance = socket.gethostname()
        self.clock = clock
        self._counts: OrderedDict[str, int] = OrderedDict()  # event name -> count written

    async def normal(self, obj: Any, reason: str, message: str) -> None:
        await self.record(obj, NORMAL, reason, message)

    async def warning(self, obj: Any, reason: str, message: str) -> None:
        await self.record(obj, WARNING, reason, message)

    async def record(self, obj: Any, type_: str, reason: str, message: str) -> None:
        meta = obj.metadata
        namespace = meta.namespace or "default"
        digest = hashlib.sha256(
            "\0".join((str(meta.uid), type_, reason, message)).encode()
        ).hexdigest()[:16]
        name = f"{meta.name}.{digest}"
        try:
            if name not in self._counts or not await self._bump(name, namespace):
                await self._create(obj, name, namespace, type_, reason, message)
        except (ApiError, httpx2.HTTPError, OSError) as error:
            log.warning(
                "could not record event",
                extra=fields(object=f"{namespace}/{meta.name}", reason=reason, error=str(error)),
            )

    async def _create(
        self, obj: Any, name: str, namespace: str, type_: str, reason: str, message: str
    ) -> None:
        now = self.clock.now()
        event = Event(
            metadata=ObjectMeta(name=name, namespace=namespace),
            involvedObject=ObjectReference(
                apiVersion=obj.apiVersion,
                kind=obj.kind,
                name=obj.metadata.name,
                namespace=obj.metadata.namespace,
                uid=obj.metadata.uid,
            ),
            type=type_,
            reason=reason,
            message=message[:1024],
            count=1,
            firstTimestamp=now,
            lastTimestamp=now,
            source=EventSource(component=self.component, host=self.instance),
            reportingComponent=self.component,
            reportingInstance=self.instance,
        )
        try:
            await self.client.create(event)
            self._remember(name, 1)
        except ApiError as error:
            if error.status.code != 409:
                raise
            await self._bump(name, namespace)  # written before we restarted

    async def _bump(self, name: str, namespace: str) -> bool:
        """Count one more occurrence; False if the Event is gone (expired)."""
        count = self._counts.get(name)
        try:
            if count is None:
                existing = await self.client.get(Event, name, namespace=namespace)
                count = existing.count or 1
            await self.client.patch(
                Event,
                name,
                {"count": count + 1, "lastTimestamp": self.clock.now().isoformat()},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            if error.status.code != 404:
                raise
            self._counts.pop(name, None)  # expired (the apiserver's event TTL)
            return False
        self._remember(name, count + 1)
        return True

    def _remember(self, name: str, count: int) -> None:
        self._counts[name] = count
        self._counts.move_to_end(name)
        while len(self._counts) > _REMEMBERED:
            self._counts.popitem(last=False)
