"""Who is calling, and may they: Kubernetes bearer tokens checked with TokenReview, each
endpoint authorized with a SubjectAccessReview (docs/teardown.md, "Authorization").

Every endpoint names a ``Permission``: a verb on a resource of metalmend's API group
``promenade.metalmend.dev``, for the Node named in the path. RBAC rules grant them like any
other (deploy/rbac/serve.yaml); ``resourceNames`` may limit them to some Nodes. The API
server answers both reviews; metalmend keeps no users.

What a token costs the API server is bounded (docs/teardown.md, "What a token costs the
API server"; docs/security.md):

- ``ReviewCache``: each TokenReview answer, authenticated or not, is kept for
  ``serve.token_cache_seconds`` (10 s, as Kubernetes' delegating authenticator caches the
  TokenReviews of extension API servers), keyed by the token's SHA-256, never the token.
  A revoked token therefore works for up to that long; a SubjectAccessReview is never
  cached, so a removed binding stops working at the next request.
- One review per token at a time: concurrent requests with the same token wait for the
  one TokenReview under way and share its answer (single flight).
- Lanes: a token is reviewed outside any budget when it is *known* (a review proved it
  valid: its SHA-256 is remembered, ``Known``) or *signed* (a JWT the cluster's
  ServiceAccount issuer signed, checked locally against ``/openid/v1/jwks``:
  ``web/signed.py``); garbage is neither, so it cannot lock such callers out. Every other
  token is *unproven*: its review is paid from its client address's budget.
- ``FailureLimit``: the budget, a token bucket per client address
  (``serve.auth_failures_burst``, one back every ``serve.auth_failure_interval``). A
  review of an unproven token *claims* one before it is sent (check and take with no
  await between, so concurrent requests cannot all pass one check); the claim is given
  back when the token proves valid. An address whose bucket is empty gets 429 with
  ``Retry-After`` for unproven tokens, and no TokenReview. A known or signed token that a
  review refuses takes one from the bucket and is remembered as refused (unproven from
  then on): each costs at most one review outside the budget.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

import httpx2
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from lightkube import ApiError, AsyncClient
from lightkube.models.authentication_v1 import TokenReviewSpec
from lightkube.models.authorization_v1 import ResourceAttributes, SubjectAccessReviewSpec
from lightkube.resources.authentication_v1 import TokenReview
from lightkube.resources.authorization_v1 import SubjectAccessReview

from metalmend.errors import Refused
from metalmend.kube import errors
from metalmend.kube.rbac import API_GROUP as API_GROUP
from metalmend.kube.rbac import Caller as Caller
from metalmend.kube.rbac import Permission as Permission
from metalmend.log import fields
from metalmend.web import deps
from metalmend.web.signed import Keys
from metalmend.web.status import StatusError

log = logging.getLogger(__name__)


# One per Promenade endpoint. POST to a step is "create" on the Node's subresource, as a
# POST to pods/eviction is in Kubernetes.
DRAIN = Permission("nodes", "drain", "create")
CLEAR_LABELS = Permission("nodes", "clear-labels", "create")
REMOVE_ETCD = Permission("nodes", "remove-etcd", "create")
SHUTDOWN_KUBELET = Permission("nodes", "shutdown-kubelet", "create")
REMOVE_FROM_CLUSTER = Permission("nodes", "remove-from-cluster", "create")
DECOMMISSION = Permission("nodes", "decommission", "create")
ETCD_HEALTH = Permission("etcdclusters", "health", "get")


def _unauthorized(detail: str) -> StatusError:
    return StatusError(401, "Unauthorized", f"Credentials are not established: {detail}")


def _throttled(wait: float) -> StatusError:
    seconds = max(1, math.ceil(wait))
    return StatusError(
        429,
        "TooManyRequests",
        f"too many failed authentications from this address: try again in {seconds}s",
        headers={"Retry-After": str(seconds)},
    )


NO_TOKEN = (
    "send a Kubernetes token, as Authorization: Bearer <token> or as X-Auth-Token: <token>"
    " (Airship's clients)"
)
TWO_TOKENS = (
    "Authorization: Bearer and X-Auth-Token name two different tokens: send one of them"
    " (or the same token in both)"
)


def bearer_token(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized(NO_TOKEN)
    return token.strip()


def presented_token(authorization: str | None, auth_token: str | None) -> str:
    """The one token a request presents: ``Authorization: Bearer`` (Kubernetes' way) or
    ``X-Auth-Token`` (how Airship's clients send their Keystone token, here a Kubernetes
    token), both checked by the same TokenReview. Both present: they must agree, else 401
    (which one would be checked would be a guess)."""
    header = (auth_token or "").strip()
    if not header:
        return bearer_token(authorization)
    if authorization is None or not authorization.strip():
        return header
    if bearer_token(authorization) != header:
        raise _unauthorized(TWO_TOKENS)
    return header


@dataclass(frozen=True)
class Limits:
    """How long TokenReview answers are kept, and how many failed authentications a client
    address may make (``serve`` settings of the same names; the defaults are theirs)."""

    token_cache_seconds: float = 10.0
    token_cache_size: int = 10_000
    auth_failures_burst: int = 10
    auth_failure_interval: float = 1.0
    addresses: int = 10_000  # client addresses whose failures are counted at once


INVALID = "the token is not valid (expired, revoked or unknown)"


class ReviewCache:
    """TokenReview answers by the SHA-256 of their token, each for ``ttl`` seconds, the
    oldest dropped beyond ``size`` entries. ``None`` is a cached refusal."""

    def __init__(self, ttl: float, size: int, now: Callable[[], float] = time.monotonic) -> None:
        self.ttl, self.size, self.now = ttl, size, now
        self._answers: OrderedDict[bytes, tuple[float, Caller | None]] = OrderedDict()

    @staticmethod
    def key(token: str) -> bytes:
        return hashlib.sha256(token.encode()).digest()

    def get(self, key: bytes) -> tuple[bool, Caller | None]:
        """(found, the caller or None for a refusal)."""
        found = self._answers.get(key)
        if found is None:
            return False, None
        if found[0] <= self.now():
            del self._answers[key]
            return False, None
        return True, found[1]

    def put(self, key: bytes, caller: Caller | None) -> None:
        self._answers[key] = (self.now() + self.ttl, caller)
        self._answers.move_to_end(key)
        while len(self._answers) > self.size:
            self._answers.popitem(last=False)


class FailureLimit:
    """A token bucket per client address: the TokenReviews of unproven tokens it may still
    cost. ``burst`` at most, one back every ``interval`` seconds. Addresses with a full
    bucket are forgotten; beyond ``addresses`` the least recently charged are."""

    def __init__(
        self, burst: int, interval: float, addresses: int, now: Callable[[], float] = time.monotonic
    ) -> None:
        self.burst, self.interval, self.addresses, self.now = burst, interval, addresses, now
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # tokens, at

    def _tokens(self, address: str) -> float:
        found = self._buckets.get(address)
        if found is None:
            return float(self.burst)
        tokens, at = found
        return min(float(self.burst), tokens + (self.now() - at) / self.interval)

    def _set(self, address: str, tokens: float) -> None:
        if tokens >= self.burst:
            self._buckets.pop(address, None)
            return
        self._buckets[address] = (tokens, self.now())
        self._buckets.move_to_end(address)
        while len(self._buckets) > self.addresses:
            self._buckets.popitem(last=False)

    def wait(self, address: str) -> float:
        """Seconds until ``address`` may try again (0: now)."""
        tokens = self._tokens(address)
        return 0.0 if tokens >= 1.0 else (1.0 - tokens) * self.interval

    def claim(self, address: str) -> float:
        """Take one for a review about to be sent: 0 when taken, else the seconds until
        one is back (nothing taken). Synchronous: no other request runs in between."""
        wait = self.wait(address)
        if wait == 0:
            self._set(address, self._tokens(address) - 1.0)
        return wait

    def refund(self, address: str) -> None:
        """Give back a claim: the token proved valid."""
        self._set(address, self._tokens(address) + 1.0)

    def failed(self, address: str) -> None:
        """Take one for a failed review that claimed none (a known or signed token)."""
        self._set(address, max(0.0, self._tokens(address) - 1.0))


class Known:
    """What reviews said of tokens, by SHA-256, beyond the cache's seconds: True for a
    token a review authenticated (reviewed again outside any budget), False for a known or
    signed token a review refused (unproven from then on). The last ``size`` are kept."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._said: OrderedDict[bytes, bool] = OrderedDict()

    def get(self, key: bytes) -> bool | None:
        return self._said.get(key)

    def put(self, key: bytes, valid: bool) -> None:
        self._said[key] = valid
        self._said.move_to_end(key)
        while len(self._said) > self.size:
            self._said.popitem(last=False)


KNOWN, SIGNED, UNPROVEN = "known", "signed", "unproven"  # whose budget a review is
JWKS_PATH = "/openid/v1/jwks"  # the ServiceAccount issuer's public keys
JWKS_REFRESH = 60.0  # seconds between fetches of them (a token with an unknown key id)


class Gate:
    """Authenticates and authorizes callers through the API server of ``client``."""

    def __init__(self, client: AsyncClient, limits: Limits | None = None) -> None:
        self.client = client
        self.limits = limits = limits or Limits()
        self.reviews = ReviewCache(limits.token_cache_seconds, limits.token_cache_size)
        self.failures = FailureLimit(
            limits.auth_failures_burst, limits.auth_failure_interval, limits.addresses
        )
        self.known = Known(limits.token_cache_size)
        self._pending: dict[bytes, asyncio.Future[Caller | None]] = {}
        self._keys = Keys()
        self._keys_at = -math.inf  # when the issuer's keys were last fetched
        self._keys_lock = asyncio.Lock()
        self._keys_said = False  # a failed fetch is logged once

    async def caller(
        self, authorization: str | None, peer: str = "", auth_token: str | None = None
    ) -> Caller:
        """Who sends this token (401 when nobody), for the client at address ``peer``:
        ``Authorization: Bearer`` or ``X-Auth-Token`` (``presented_token``), one cache and
        one failure limit for both."""
        token = presented_token(authorization, auth_token)
        key = ReviewCache.key(token)
        found, caller = self.reviews.get(key)
        if not found:
            caller = await self._reviewed(key, token, peer)
        if caller is None:
            raise _unauthorized(INVALID)
        return caller

    async def _reviewed(self, key: bytes, token: str, peer: str) -> Caller | None:
        """The review of ``token``: the one under way, or one sent now in its lane."""
        pending = self._pending.get(key)
        if pending is None:
            lane = await self._lane(key, token)
            pending = self._pending.get(key)  # one may have started while we looked
            if pending is None:
                found, caller = self.reviews.get(key)
                if found:
                    return caller
                if lane == UNPROVEN:
                    wait = self.failures.claim(peer)  # claimed before the review is sent
                    if wait > 0:
                        raise _throttled(wait)
                pending = asyncio.ensure_future(self._settle(key, token, peer, lane))
                pending.add_done_callback(_retrieved)
                self._pending[key] = pending
        return await asyncio.shield(pending)  # a caller gone leaves it to the others

    async def _settle(self, key: bytes, token: str, peer: str, lane: str) -> Caller | None:
        """One review and what it teaches: the cache, what is known, the budget."""
        try:
            caller = await self._review(token)
        finally:
            self._pending.pop(key, None)
        self.reviews.put(key, caller)
        if caller is not None:
            self.known.put(key, True)
            if lane == UNPROVEN:
                self.failures.refund(peer)
        elif lane != UNPROVEN:
            self.known.put(key, False)  # its one review outside the budget is spent
            self.failures.failed(peer)
        return caller

    async def _lane(self, key: bytes, token: str) -> str:
        said = self.known.get(key)
        if said is not None:
            return KNOWN if said else UNPROVEN
        if token.count(".") != 2:  # not a JWT: nothing to check locally
            return UNPROVEN
        signed = (await self._issuer_keys(refresh=False)).signed(token)
        if signed is None:  # a key id we lack: perhaps rotated since the last fetch
            signed = (await self._issuer_keys(refresh=True)).signed(token)
        return SIGNED if signed else UNPROVEN

    async def _issuer_keys(self, refresh: bool) -> Keys:
        """The issuer's keys: fetched at first need, again on ``refresh`` at most every
        ``JWKS_REFRESH`` seconds (so tokens with made-up key ids cost one fetch a minute)."""
        async with self._keys_lock:
            never = self._keys_at == -math.inf
            if (never or refresh) and time.monotonic() - self._keys_at >= JWKS_REFRESH:
                self._keys_at = time.monotonic()
                self._keys = await self._fetch_keys()
            return self._keys

    async def _fetch_keys(self) -> Keys:
        generic: Any = self.client._client  # lightkube has no call for it; its HTTP client
        try:
            response = await generic._client.get(JWKS_PATH)
            response.raise_for_status()
            keys = Keys.parse(response.json())
        except (httpx2.HTTPError, OSError, ValueError) as error:
            if not self._keys_said:
                self._keys_said = True
                log.warning(
                    "cannot read the ServiceAccount issuer's keys (%s %s): a token never"
                    " reviewed is paid from its address's failed-token budget",
                    JWKS_PATH,
                    error,
                )
            return self._keys
        self._keys_said = False
        return keys

    async def _review(self, token: str) -> Caller | None:
        review = await self._create(TokenReview(spec=TokenReviewSpec(token=token)))
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            return None
        user = status.user
        return Caller(
            username=user.username or "",
            uid=user.uid or "",
            groups=tuple(user.groups or ()),
            extra={k: list(v) for k, v in (user.extra or {}).items()},
        )

    async def authorize(self, caller: Caller, permission: Permission, name: str) -> None:
        review = await self._create(
            SubjectAccessReview(
                spec=SubjectAccessReviewSpec(
                    user=caller.username,
                    uid=caller.uid or None,
                    groups=list(caller.groups),
                    extra=caller.extra or None,
                    resourceAttributes=ResourceAttributes(
                        group=permission.group,
                        resource=permission.resource,
                        subresource=permission.subresource,
                        verb=permission.verb,
                        name=name,
                    ),
                )
            )
        )
        if review.status is None or not review.status.allowed:
            log.info(
                "refused",
                extra=fields(user=caller.username, permission=permission.describe(), name=name),
            )
            raise Refused(
                f"Credentials do not permit access: {caller.username} may not"
                f" {permission.describe()}" + (f" on {name}" if name else ""),
            )

    async def _create(self, review: Any) -> Any:
        kind = type(review).__name__
        try:
            answer = await self.client.create(review)
        except ApiError as error:
            # Our own identity may not create reviews: the deployment's RBAC is incomplete.
            log.error("cannot create %s: %s", kind, error.status.message)
            raise StatusError(
                500,
                "InternalError",
                f"metalmend serve cannot check credentials: the API server refused its"
                f" {kind} ({errors.code(error)} {error.status.message})",
            ) from None
        except (httpx2.HTTPError, OSError) as error:
            raise StatusError(
                503,
                "ServiceUnavailable",
                f"metalmend serve cannot reach the API server to check credentials: {error}",
            ) from None
        return answer


bearer = HTTPBearer(auto_error=False, description="A Kubernetes bearer token")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


async def admit(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    permission: Permission,
    name: str,
) -> None:
    """Authenticate the caller (TokenReview) and authorize ``permission`` on ``name``
    (SubjectAccessReview): 401/403 as Status bodies. Every endpoint's first step."""
    gate = deps.of(request, Gate)
    caller = await authenticate(request, credentials)
    await gate.authorize(caller, permission, name)
    request.state.caller = caller  # who the teardown claim names (teardown.interlock)


def Admit(permission: Permission, name: str | None = None, *, limit: int | None = None) -> Any:
    """The gate as a FastAPI dependency, one per endpoint (``dependencies=[Admit(...)]``):
    the caller authenticated and authorized for ``permission`` on the path parameter
    ``name`` (its first ``limit`` characters; no name: the whole collection) before the
    endpoint runs, else 401, 403 or 429. The caller is then ``request.state.caller``."""

    async def admitted(request: Request, credentials: Credentials) -> Caller:
        target = str(request.path_params.get(name, "")) if name else ""
        await admit(request, credentials, permission, target[:limit])
        caller: Caller = request.state.caller
        return caller

    return Depends(admitted)


async def authenticate(
    request: Request, credentials: HTTPAuthorizationCredentials | None
) -> Caller:
    """The caller of ``request`` (TokenReview, cached briefly), or 400/401/429. The token
    is ``Authorization: Bearer`` or ``X-Auth-Token`` (Airship's clients), each header sent
    once (a second one: 400, before any review)."""
    gate = deps.of(request, Gate)
    for name in ("Authorization", "X-Auth-Token"):
        sent = len(request.headers.getlist(name))
        if sent > 1:  # which one to check would be a guess
            raise StatusError(
                400, "BadRequest", f"the {name} header is sent {sent} times: send it once"
            )
    header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
    if header is None and request.headers.get("authorization"):
        header = request.headers["authorization"]  # not Bearer: refused by name below
    peer = request.client.host if request.client else ""
    return await gate.caller(header, peer, request.headers.get("x-auth-token"))


def _retrieved(review: asyncio.Future[Caller | None]) -> None:
    """A review's error is its waiters'; with none left, it is not logged as lost."""
    if not review.cancelled():
        review.exception()


def caller_of(request: Request) -> str:
    """The user name of the request's caller (set once authenticated), for the claim."""
    caller = getattr(request.state, "caller", None)
    return str(getattr(caller, "username", "") or "")
