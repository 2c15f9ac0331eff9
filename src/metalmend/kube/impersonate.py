"""API clients that act as another user: Kubernetes user impersonation (the
``Impersonate-User``, ``-Uid``, ``-Group`` and ``-Extra-<key>`` headers, "User
impersonation" in the Kubernetes authentication reference).

``metalmend serve`` writes a site design's objects as the caller who created the action
(docs/site-actions.md, "Whose permissions apply a design"): the API server then judges
each write by the caller's RBAC and by every admission policy, as if the caller had
applied the objects themselves. Its own ServiceAccount needs ``impersonate`` for that
(deploy/rbac/serve.yaml says what that grants).

lightkube has no impersonation setting; the headers are added by a transport around the
one lightkube would build from the same configuration (its TLS verification and client
certificate), so the bearer token, the server and the TLS setup stay serve's own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx2
from lightkube import AsyncClient
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig

HEADERS = ("impersonate-user", "impersonate-uid", "impersonate-group")
EXTRA_PREFIX = "impersonate-extra-"


@dataclass(frozen=True)
class Who:
    """A user as a TokenReview answered it: what impersonating them needs."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {
            "username": self.username, "uid": self.uid, "groups": list(self.groups),
            "extra": {k: list(v) for k, v in self.extra.items()},
        }  # fmt: skip

    @classmethod
    def from_wire(cls, raw: object) -> Who | None:
        """None unless ``raw`` is a stored identity with a user name (an action stored
        before identities were kept has none: it is never run as serve instead)."""
        if not isinstance(raw, Mapping) or not isinstance(raw.get("username"), str):
            return None
        if not raw["username"]:
            return None
        groups, extra = raw.get("groups") or [], raw.get("extra") or {}
        if not isinstance(groups, list) or not isinstance(extra, Mapping):
            return None
        return cls(
            raw["username"], str(raw.get("uid") or ""), tuple(str(g) for g in groups),
            {str(k): tuple(str(v) for v in vs) for k, vs in extra.items() if isinstance(vs, list)},
        )  # fmt: skip


def headers(who: Who) -> list[tuple[str, str]]:
    """The impersonation headers for ``who``; extra keys percent-encoded, as the API server
    decodes them (one header per value)."""
    found = [("Impersonate-User", who.username)]
    if who.uid:
        found.append(("Impersonate-Uid", who.uid))
    found += [("Impersonate-Group", g) for g in who.groups]
    for key, values in sorted(who.extra.items()):
        name = "Impersonate-Extra-" + quote(key, safe="")
        found += [(name, v) for v in values]
    return found


class _Impersonating(httpx2.AsyncBaseTransport):
    def __init__(self, inner: httpx2.AsyncBaseTransport, added: list[tuple[str, str]]) -> None:
        self.inner, self.added = inner, added

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        kept = [
            (k, v)
            for k, v in request.headers.multi_items()
            if k.lower() not in HEADERS and not k.lower().startswith(EXTRA_PREFIX)
        ]
        request.headers = httpx2.Headers([*kept, *self.added])
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


def config_of(client: AsyncClient) -> SingleConfig:
    """The configuration ``client`` was built with (lightkube keeps it on its inner
    client; it has no public accessor)."""
    config = getattr(getattr(client, "_client", None), "config", None)
    if not isinstance(config, SingleConfig):
        raise TypeError("cannot tell how this API client connects: no lightkube configuration")
    return config


def impersonating(
    config: SingleConfig | KubeConfig,
    who: Who,
    field_manager: str | None = None,
    *,
    dry_run: bool = False,
) -> AsyncClient:
    """A client of the same server with the same credentials, acting as ``who``
    (``dry_run``: every write a server-side dry run, judged by RBAC and admission as the
    real one would be, and stored nowhere)."""
    single = config.get() if isinstance(config, KubeConfig) else config
    if single is None or single.user is None:
        raise TypeError("cannot impersonate: the API configuration names no user")
    verify = client_adapter.verify_cluster(single.cluster, single.user, single.abs_file)
    transport = _Impersonating(httpx2.AsyncHTTPTransport(verify=verify), headers(who))
    return AsyncClient(single, field_manager=field_manager, transport=transport, dry_run=dry_run)


def impersonator(client: AsyncClient, field_manager: str) -> Callable[..., AsyncClient]:
    """``acting_as(who, dry_run=False)``: clients on ``client``'s connection settings, acting
    as ``who`` (read when called: ``client`` may be any object until then)."""

    def acting_as(who: Who, dry_run: bool = False) -> AsyncClient:
        return impersonating(config_of(client), who, field_manager, dry_run=dry_run)

    return acting_as
