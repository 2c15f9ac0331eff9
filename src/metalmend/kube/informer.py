"""An informer: list one kind, then watch it from the list's resourceVersion, keeping a
Store true and telling handlers what changed.

- Watches ask for bookmarks, so a reconnect resumes from a recent resourceVersion even
  when nothing of ours changed.
- 410 Gone (history compacted, or a restarted apiserver's fresh watch cache) means "list
  again": the store is replaced and handlers hear the differences, deletions included.
- Any other failure (connection, 5xx, 403) is retried with exponential backoff; a
  Forbidden names the resource and verb in the log, and the informer stays unsynced until
  a list succeeds, so /readyz stays false.
- ``failing_since`` tells health checks how long the API server has been out of reach for
  this informer: set at the first transport error or 5xx, cleared by a successful list,
  an accepted watch request (the server answered 200) or any watch event.
- A 404 on the list or watch of a kind that discovery says is no longer served (its
  CustomResourceDefinition deleted under a running process) is not an outage: the
  informer says so once (``unserved``, one log line, naming the kind and the fix), empties
  its store (no object of an unserved kind exists), asks discovery quietly until the kind
  is served again, then lists it again and says so.
- ``transform`` (as client-go's ``SetTransform``), when set, makes what the store holds
  from each listed or watched object: an adapter at the edge that adds what the object
  implies elsewhere (controllers/machines.py: a Cluster API Machine's host through its
  Metal3Machine). It must not change the object's key or resourceVersion; applied again to
  what it returned, it recomputes as from the object as listed (``refresh`` does that when
  what it reads elsewhere changed), and returns its argument itself when nothing changes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.core import resource as lkres
from lightkube.core.generic_client import WatchDriver, transform_exception
from lightkube.core.selector import build_selector

from metalmend.kube import discovery, errors, generic, metrics
from metalmend.kube.store import IndexFunc, Store, object_key
from metalmend.kube.workqueue import Backoff
from metalmend.log import fields

log = logging.getLogger(__name__)

# (old, new): old is None for an addition, new is None for a deletion.
Handler = Callable[[Any | None, Any | None], None]

LIST_CHUNK = 500
UNSERVED_POLL = 10.0  # at most this many seconds between discovery looks at a gone kind


def resource_name(resource: Any) -> str:
    info = resource._api_info
    group = info.resource.group
    return f"{info.plural}.{group}" if group else str(info.plural)


class Informer:
    def __init__(
        self,
        client: AsyncClient,
        resource: Any,
        *,
        namespace: str | None = None,
        labels: dict[str, Any] | None = None,
        fields: dict[str, Any] | None = None,
        indexes: Mapping[str, IndexFunc] | None = None,
        backoff: Backoff | None = None,
        watch_timeout: int = 290,
    ) -> None:
        self.client = client
        self.resource = resource
        self.name = resource_name(resource)
        self.namespace = namespace
        self.labels = labels
        self.fields = fields
        self.store = Store(dict(indexes or {}))
        self.backoff = backoff or Backoff(base=0.5, cap=30.0)
        self.watch_timeout = watch_timeout
        self.synced = asyncio.Event()
        self.resource_version: str | None = None
        self.lists = 0
        self.last_error: str | None = None
        self._failures = 0
        self.failing_since: float | None = None  # time.monotonic(): API out of reach since
        self.unserved: str | None = None  # why: the kind is not served (discovery.gone_line)
        self._handlers: list[Handler] = []
        self.transform: Callable[[Any], Any] | None = None

    def _view(self, obj: Any) -> Any:
        return self.transform(obj) if self.transform is not None else obj

    def refresh(self, key: str) -> None:
        """Apply ``transform`` again to the stored object ``key`` (what it reads elsewhere
        changed); the handlers hear the change as an update, and the indexes follow."""
        stored = self.store.get(key)
        if stored is None or self.transform is None:
            return
        new = self.transform(stored)
        if new is not stored:
            self._notify(self.store.upsert(new), new)

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    @property
    def _namespaced(self) -> bool:
        return issubclass(self.resource, lkres.NamespacedResource)

    @property
    def _scope(self) -> str | None:
        # lightkube reads namespace=None as "the client's default namespace"; "*" is all.
        return (self.namespace or "*") if self._namespaced else None

    async def run(self) -> None:
        """List and watch until cancelled."""
        verb = "list"
        while True:
            try:
                if self.resource_version is None:
                    verb = "list"
                    await self._list()
                verb = "watch"
                await self._watch()
            except ApiError as error:
                code = errors.code(error)
                metrics.INFORMER_ERRORS.labels(self.name, verb, str(code)).inc()
                if errors.is_gone(error):
                    log.info("watch history gone, listing again", extra=fields(resource=self.name))
                    self.resource_version = None
                    continue
                if errors.is_not_found(error):
                    if not await self._while_unserved():
                        problem = f"{code} {error.status.message}"
                        await self._retry_later(verb, problem, False, quiet=3)
                    continue
                unreachable = errors.is_unavailable(error)  # (a 403 is an answer, not an outage)
                await self._retry_later(verb, f"{code} {error.status.message}", unreachable)
            except (httpx2.HTTPError, OSError) as error:
                # A watch answered "404 page not found" in plain text: no Status to read.
                response = (
                    getattr(error, "response", None)
                    if isinstance(error, httpx2.HTTPStatusError)
                    else None
                )
                if response is not None and response.status_code == 404:
                    metrics.INFORMER_ERRORS.labels(self.name, verb, "404").inc()
                    if not await self._while_unserved():
                        await self._retry_later(verb, "404 not found", False, quiet=3)
                    continue
                metrics.INFORMER_ERRORS.labels(self.name, verb, "transport").inc()
                text = " ".join(str(error).split()) or repr(error.__cause__ or error.__context__)
                await self._retry_later(verb, f"{type(error).__name__}: {text}", True)

    async def _while_unserved(self) -> bool:
        """After a 404 on our list or watch: False when discovery does not say the kind is
        gone (an ordinary error: the caller retries). Else: say so once, empty the store,
        wait quietly until the kind is served again, and return True (list again)."""
        group, version, plural = discovery.kind_of(self.resource)
        group_version = f"{group}/{version}" if group else version
        if await discovery.serves(self.client, group_version, plural) is not False:
            return False
        self.unserved = discovery.gone_line(group, version, plural)
        self._contact()  # the API server answered: not out of reach
        log.warning("%s", self.unserved, extra=fields(resource=self.name))
        self._replace([])
        looks = 0
        while True:
            looks += 1
            await asyncio.sleep(min(self.backoff.delay(looks), UNSERVED_POLL))
            if await discovery.serves(self.client, group_version, plural):
                break
        log.info("%s is served again, listing it", self.name, extra=fields(resource=self.name))
        self.unserved = None
        self.resource_version = None
        self._failures = 0
        return True

    def _contact(self) -> None:
        """The API server answered: it is reachable (whatever the backoff still counts)."""
        self.failing_since = None

    async def _retry_later(
        self, verb: str, problem: str, unreachable: bool, quiet: int = 0
    ) -> None:
        """Log (the first failures, then every tenth) and wait before trying again;
        ``quiet``: the first that many only at debug level (a 404 while discovery still
        serves the kind: its CustomResourceDefinition is being deleted, and the next
        attempt says so in one line)."""
        # Failures count up until a list succeeds or a watch event arrives.
        self._failures += 1
        if unreachable and self.failing_since is None:
            self.failing_since = time.monotonic()
        failures = self._failures
        self.last_error = f"{verb} {self.name}: {problem}"
        loud = failures > quiet and (failures <= quiet + 3 or failures % 10 == 0)
        level = logging.WARNING if loud else logging.DEBUG
        log.log(
            level,
            "cannot %s %s, retrying",
            verb,
            self.name,
            extra=fields(resource=self.name, verb=verb, error=problem, attempt=failures),
        )
        await asyncio.sleep(self.backoff.delay(failures))

    async def _list(self) -> None:
        listing: Any = self.client.list(
            self.resource,
            namespace=self._scope,
            labels=self.labels,
            fields=self.fields,
            chunk_size=LIST_CHUNK,
        )
        objects = [self._view(without_managed_fields(obj)) async for obj in listing]
        self.resource_version = str(listing.resourceVersion)
        self.lists += 1
        self.last_error = None
        self._failures = 0
        self._contact()
        metrics.INFORMER_RELISTS.labels(self.name).inc()
        self._replace(objects)
        self.synced.set()
        log.debug("listed", extra=fields(resource=self.name, objects=len(objects)))

    def _replace(self, objects: list[Any]) -> None:
        """The store holds ``objects`` and nothing else; handlers hear the differences."""
        previous = {object_key(o): o for o in self.store.values()}
        self.store.replace(objects)
        for obj in objects:
            old = previous.pop(object_key(obj), None)
            if old is None or old.metadata.resourceVersion != obj.metadata.resourceVersion:
                self._notify(old, obj)
        for gone in previous.values():
            self._notify(gone, None)

    async def _watch(self) -> None:
        # lightkube's public watch() cannot ask for bookmarks; its request builder can.
        generic: Any = self.client._client
        request = generic.prepare_request(
            "list",
            res=self.resource,
            namespace=self._scope,
            watch=True,
            params={
                "resourceVersion": self.resource_version,
                "allowWatchBookmarks": "true",
                "timeoutSeconds": self.watch_timeout,
                "labelSelector": build_selector(self.labels) if self.labels else None,
                "fieldSelector": build_selector(self.fields, for_fields=True)
                if self.fields
                else None,
            },
        )
        # lightkube's watch() does the same loop but cannot say when the server accepted
        # the request, which is what tells health checks that the API server is back.
        driver: Any = WatchDriver(request, generic._client.build_request)
        while True:
            response = await generic.send(
                driver.get_request(timeout=generic._watch_timeout), stream=True
            )
            try:
                response.raise_for_status()
                self._contact()
                async for line in response.aiter_lines():
                    version = bookmark_version(line)
                    if version is not None:  # not decoded as an object: see bookmark_version
                        driver._version = version  # a reconnect resumes from it
                        self._on_event("BOOKMARK", None, version)
                        continue
                    self._on_event(*driver.process_one_line(line))
            except ApiError:
                raise  # (an ApiError is an HTTPStatusError too: an ERROR event, 410 Gone)
            except httpx2.HTTPStatusError as error:
                await response.aread()  # the Status body, for ApiError's message
                if "Content-Type" not in error.response.headers:
                    raise
                raise transform_exception(error) from None
            finally:
                await response.aclose()

    def _on_event(self, event: str, obj: Any, version: str | None = None) -> None:
        metrics.INFORMER_EVENTS.labels(self.name, event).inc()
        self.resource_version = version or obj.metadata.resourceVersion
        self._failures = 0
        self._contact()
        if event == "BOOKMARK" or obj is None:
            return
        without_managed_fields(obj)
        if event == "DELETED":
            old = self.store.delete(object_key(obj))
            self._notify(old if old is not None else obj, None)
        else:
            obj = self._view(obj)
            self._notify(self.store.upsert(obj), obj)

    def _notify(self, old: Any | None, new: Any | None) -> None:
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:
                log.exception("event handler failed", extra=fields(resource=self.name))


def without_managed_fields(obj: Any) -> Any:
    """``obj`` without ``metadata.managedFields`` (changed in place): which manager set
    which field, kept by the API server for server-side apply. metalmend never reads them
    (its writes carry their own intent), yet they were the larger part of a cached Node
    and thousands of objects for the garbage collector to walk (docs/scale.md). A
    generic resource (a dict) keeps its metadata as a dict; a typed one as ObjectMeta."""
    metadata = obj.get("metadata") if isinstance(obj, dict) else getattr(obj, "metadata", None)
    if isinstance(metadata, dict):
        if metadata.pop("managedFields", None) is not None:
            generic.forget(obj)  # its metadata as parsed before still held them
    elif metadata is not None:
        metadata.managedFields = None
    return obj


def bookmark_version(line: str) -> str | None:
    """The resourceVersion of a BOOKMARK watch event, None for any other line.

    A bookmark's object is an empty object of the watched kind with only its
    resourceVersion set, serialized with the kind's required fields as null (a Pod's
    ``spec.containers: null``): lightkube's typed decoder refuses it (msgspec
    ValidationError), which would break the watch on every bookmark. So bookmarks are read
    here, as JSON, and never decoded into the resource's model."""
    if '"BOOKMARK"' not in line[:64]:
        return None
    try:
        event = json.loads(line)
        version = event["object"]["metadata"]["resourceVersion"]
    except (ValueError, KeyError, TypeError):
        return None
    return str(version) if event.get("type") == "BOOKMARK" and version else None
