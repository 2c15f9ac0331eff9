"""Kubernetes Events, aggregated and rate-limited as client-go's event recorder does.

- The same (object, type, reason, message) recorded again bumps ``count`` and
  ``lastTimestamp`` of one Event instead of creating another. The Event's name is derived
  from what it says, so aggregation survives a restart of the controller.
- Spam filter, as client-go's ``EventCorrelator`` (tools/record/events_cache.go): a token
  bucket per object and source (ours is one source), burst 25, refilled one token every
  5 minutes. Recording beyond it drops the Event (a debug log line says so).
- Quiet bumps: an Event written less than ``bump_interval`` (60 s) ago is not written
  again when it recurs; the occurrences are counted in memory and carried by the next
  write after the interval. A host failing every second thus costs its Event one write a
  minute at most, not one per failure (client-go patches every occurrence). Counts still
  pending when the process ends are lost: the count is a courtesy, not state.

Recording never raises: an Event that cannot be written is logged and dropped, because an
Event is a courtesy to the operator, not state.
"""

from __future__ import annotations

import hashlib
import logging
import socket
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event
from lightkube.types import PatchType

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.kube import errors
from metalmend.log import fields

log = logging.getLogger(__name__)

_REMEMBERED = 4096  # events (and objects' buckets) kept in memory; older ones are read back
NORMAL = "Normal"
WARNING = "Warning"
SPAM_BURST = 25  # client-go's defaultSpamBurst
SPAM_REFILL_SECONDS = 300.0  # client-go's defaultSpamQPS: 1/300 (one token per 5 minutes)
BUMP_INTERVAL_SECONDS = 60.0  # an unchanged Event is written again at most this often


@dataclass
class _Written:
    count: int  # the count on the server
    at: float  # when we last wrote it (epoch seconds, from the clock)
    pending: int = 0  # occurrences since, not yet written


@dataclass
class _Bucket:
    tokens: float
    at: float


class EventRecorder:
    def __init__(
        self,
        client: AsyncClient,
        component: str = "metalmend",
        clock: Clock = SYSTEM_CLOCK,
        *,
        burst: int = SPAM_BURST,
        refill_seconds: float = SPAM_REFILL_SECONDS,
        bump_interval: float = BUMP_INTERVAL_SECONDS,
    ) -> None:
        self.client = client
        self.component = component
        self.instance = socket.gethostname()
        self.clock = clock
        self.burst = burst
        self.refill_seconds = refill_seconds
        self.bump_interval = bump_interval
        self.dropped = 0  # Events the spam filter refused (for tests and benchmarks)
        self._written: OrderedDict[str, _Written] = OrderedDict()  # by Event name
        self._buckets: OrderedDict[str, _Bucket] = OrderedDict()  # by object uid

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
        now = self.clock.now().timestamp()
        written = self._written.get(name)
        if written is not None and now - written.at < self.bump_interval:
            written.pending += 1  # said a moment ago: carried by the next write
            return
        if not self._allowed(str(meta.uid), now):
            self.dropped += 1
            if written is not None:
                written.pending += 1
            log.debug(
                "event dropped by the spam filter",
                extra=fields(object=f"{namespace}/{meta.name}", reason=reason),
            )
            return
        try:
            if written is None or not await self._bump(name, namespace, 1 + written.pending):
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
            if not errors.is_conflict(error):
                raise
            await self._bump(name, namespace, 1)  # written before we restarted

    async def _bump(self, name: str, namespace: str, occurrences: int) -> bool:
        """Count ``occurrences`` more; False if the Event is gone (expired)."""
        written = self._written.get(name)
        count = written.count if written is not None else None
        try:
            if count is None:
                existing = await self.client.get(Event, name, namespace=namespace)
                count = existing.count or 1
            await self.client.patch(
                Event,
                name,
                {"count": count + occurrences, "lastTimestamp": self.clock.now().isoformat()},
                namespace=namespace,
                patch_type=PatchType.MERGE,
            )
        except ApiError as error:
            if not errors.is_not_found(error):
                raise
            self._written.pop(name, None)  # expired (the apiserver's event TTL)
            return False
        self._remember(name, count + occurrences)
        return True

    def _remember(self, name: str, count: int) -> None:
        self._written[name] = _Written(count, self.clock.now().timestamp())
        self._written.move_to_end(name)
        while len(self._written) > _REMEMBERED:
            self._written.popitem(last=False)

    def _allowed(self, uid: str, now: float) -> bool:
        """Take a token from the object's bucket (client-go's spam filter)."""
        bucket = self._buckets.get(uid)
        if bucket is None:
            bucket = self._buckets[uid] = _Bucket(float(self.burst), now)
        elapsed = max(now - bucket.at, 0.0)
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed / self.refill_seconds)
        bucket.at = now
        self._buckets.move_to_end(uid)
        while len(self._buckets) > _REMEMBERED:
            self._buckets.popitem(last=False)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True
