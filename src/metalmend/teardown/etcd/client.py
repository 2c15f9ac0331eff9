"""A small etcd v3 client over etcd's JSON gRPC gateway (``POST /v3/...``), with httpx.

Only what teardown needs: the member list, removing a member, a member's status (its
leader and raft term), moving leadership, and each endpoint's ``/health``. Every call has
a hard deadline (the whole exchange, not each read), and every answer is read up to a cap
and checked field by field: an endpoint is a network peer, and what it says is input.

Gateway conventions (etcd's ``api/etcdserverpb`` protos through grpc-gateway): keys are
the proto field names (``ID``, ``targetID``, ``header.member_id``); 64-bit integers are
decimal strings; zero values are left out; an error is an HTTP code with a body
``{"code", "message"}`` (``error`` too in 3.5).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import httpx

DEADLINE = 5.0  # seconds for one call, connection included (etcdctl's default)
MAX_ANSWER = 1 << 20  # bytes: a member list of thousands of members fits


class EtcdError(Exception):
    """A call did not give an answer we can use; ``message`` says which and why."""

    def __init__(self, endpoint: str, message: str) -> None:
        super().__init__(f"{endpoint}: {message}")
        self.endpoint = endpoint
        self.message = message


class EtcdUnreachable(EtcdError):
    """No answer: refused, reset, timed out, or not HTTP."""


class EtcdInvalid(EtcdError):
    """An answer that is not what etcd says: the endpoint is not etcd, or not well."""


class EtcdRefused(EtcdError):
    """etcd answered with an error (``status`` the HTTP code, ``text`` its message)."""

    def __init__(self, endpoint: str, status: int, text: str) -> None:
        super().__init__(endpoint, f"etcd answered {status}: {text}")
        self.status = status
        self.text = text

    @property
    def retryable(self) -> bool:
        """``etcdserver: unhealthy cluster`` (503): a peer connected less than 5 s ago, or
        an election under way, or leadership just moved (``not leader``): asking again later,
        after looking again, may work. 400 FailedPrecondition (not enough started members)
        and others will not change by asking again."""
        transient = ("leader changed", "not leader", "timed out", "no leader")
        return self.status in (429, 502, 503, 504) or any(t in self.text for t in transient)

    @property
    def member_not_found(self) -> bool:
        return "member not found" in self.text


@dataclass(frozen=True)
class Member:
    id: int
    name: str  # empty until the member has started and published it
    peer_urls: tuple[str, ...]
    client_urls: tuple[str, ...]
    is_learner: bool = False


@dataclass(frozen=True)
class EndpointStatus:
    member_id: int
    leader: int  # 0: no leader known
    raft_term: int
    version: str


@dataclass(frozen=True)
class EndpointHealth:
    endpoint: str
    healthy: bool
    reason: str  # etcd's reason, or why no health answer was had


# ---- reading hostile answers ---------------------------------------------------------------


def _uint64(value: object, field: str) -> int:
    """A uint64 as the gateway writes it (a decimal string), or absent (zero)."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ValueError(f"{field} is not a number")
    number = int(value)
    if not 0 <= number < 1 << 64:
        raise ValueError(f"{field} is out of range")
    return number


def _urls(value: object, field: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(u, str) for u in value):
        raise ValueError(f"{field} is not a list of URLs")
    return tuple(u[:2048] for u in value[:64])


def _member(raw: object) -> Member:
    if not isinstance(raw, dict):
        raise ValueError("a member is not an object")
    name = raw.get("name", "")
    if not isinstance(name, str):
        raise ValueError("a member's name is not a string")
    return Member(
        id=_uint64(raw.get("ID"), "ID"),
        name=name[:256],
        peer_urls=_urls(raw.get("peerURLs"), "peerURLs"),
        client_urls=_urls(raw.get("clientURLs"), "clientURLs"),
        is_learner=raw.get("isLearner") is True,
    )


def _members(answer: dict[str, Any]) -> list[Member]:
    raw = answer.get("members", [])
    if not isinstance(raw, list):
        raise ValueError("members is not a list")
    return [_member(m) for m in raw[:1000]]


# ---- the client ------------------------------------------------------------------------------


class EtcdClient:
    """Calls to one endpoint at a time (``http(s)://host:port``, a member's client URL)."""

    def __init__(
        self, http: httpx.AsyncClient | None = None, deadline: float = DEADLINE, owned: bool = False
    ) -> None:
        self._http = http or httpx.AsyncClient(timeout=deadline)
        self._owned = owned or http is None
        self.deadline = deadline
        self.headers: dict[str, str] = {}  # Authorization, when the cluster has auth on
        # True when this client carries credentials (a password, a token, a client
        # certificate): then it refuses, before connecting, any endpoint not https.
        self.secure_only = False

    async def aclose(self) -> None:
        if self._owned:
            await self._http.aclose()

    async def __aenter__(self) -> EtcdClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _exchange(
        self, method: str, endpoint: str, path: str, body: dict[str, Any] | None
    ) -> tuple[int, bytes]:
        url = endpoint.rstrip("/") + path
        if (self.secure_only or self.headers) and not url.lower().startswith("https://"):
            # A token (or, authenticating, a password) never travels in cleartext.
            raise EtcdUnreachable(
                endpoint, f"{path}: not contacted: credentials are sent over https only"
            )
        try:
            async with asyncio.timeout(self.deadline):
                request = self._http.build_request(
                    method, url, json=body, headers=self.headers, timeout=self.deadline
                )
                response = await self._http.send(request, stream=True)
                try:
                    data = bytearray()
                    async for chunk in response.aiter_bytes():
                        data += chunk
                        if len(data) > MAX_ANSWER:
                            raise EtcdInvalid(
                                endpoint, f"answer to {path} larger than {MAX_ANSWER} bytes"
                            )
                finally:
                    await response.aclose()
        except TimeoutError:
            raise EtcdUnreachable(
                endpoint, f"no answer to {path} within {self.deadline:g}s"
            ) from None
        except (httpx.HTTPError, OSError) as error:
            raise EtcdUnreachable(endpoint, f"{path}: {type(error).__name__}: {error}") from None
        return response.status_code, bytes(data)

    async def _call(self, endpoint: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
        status, data = await self._exchange("POST", endpoint, path, body)
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if status != 200:
            text = answer.get("message") if isinstance(answer, dict) else None
            if not isinstance(text, str):
                # Not etcd's JSON error: whatever answered is not shown (the endpoint may
                # be any server a design names; its answer is not the caller's to read).
                text = "an answer that is not etcd's (not shown)"
            raise EtcdRefused(endpoint, status, text[:500])
        if not isinstance(answer, dict):
            raise EtcdInvalid(endpoint, f"answer to {path} is not a JSON object")
        return answer

    async def member_list(self, endpoint: str, linearizable: bool = True) -> list[Member]:
        """The members as the cluster agreed them (``linearizable``: needs a quorum), or as
        this member last knew them."""
        body = {"linearizable": True} if linearizable else {}
        answer = await self._call(endpoint, "/v3/cluster/member/list", body)
        try:
            return _members(answer)
        except ValueError as error:
            raise EtcdInvalid(endpoint, f"member list: {error}") from None

    async def member_remove(self, endpoint: str, member_id: int) -> list[Member]:
        """Remove ``member_id``; the members left. Send it to a member other than the one
        leaving (etcd refuses a live member removing itself in some states)."""
        answer = await self._call(endpoint, "/v3/cluster/member/remove", {"ID": str(member_id)})
        try:
            return _members(answer)
        except ValueError as error:
            raise EtcdInvalid(endpoint, f"member remove: {error}") from None

    async def member_add(self, endpoint: str, peer_urls: tuple[str, ...]) -> Member:
        """Add a voting member with ``peer_urls`` (etcd MemberAdd); the member added, not
        started yet (no name). etcd refuses peer URLs another member already has."""
        answer = await self._call(endpoint, "/v3/cluster/member/add", {"peerURLs": list(peer_urls)})
        try:
            return _member(answer.get("member"))
        except ValueError as error:
            raise EtcdInvalid(endpoint, f"member add: {error}") from None

    async def status(self, endpoint: str) -> EndpointStatus:
        answer = await self._call(endpoint, "/v3/maintenance/status", {})
        try:
            header = answer.get("header", {})
            if not isinstance(header, dict):
                raise ValueError("header is not an object")
            version = answer.get("version", "")
            return EndpointStatus(
                member_id=_uint64(header.get("member_id"), "header.member_id"),
                leader=_uint64(answer.get("leader"), "leader"),
                raft_term=_uint64(answer.get("raftTerm", header.get("raft_term")), "raftTerm"),
                version=version[:64] if isinstance(version, str) else "",
            )
        except ValueError as error:
            raise EtcdInvalid(endpoint, f"status: {error}") from None

    async def move_leader(self, endpoint: str, target_id: int) -> None:
        """Hand leadership to ``target_id``; ``endpoint`` must be the leader's."""
        await self._call(
            endpoint, "/v3/maintenance/transfer-leadership", {"targetID": str(target_id)}
        )

    async def authenticate(self, endpoint: str, username: str, password: str) -> str:
        """A token for etcd's own auth (``/v3/auth/authenticate``), to send as
        ``Authorization``. The password goes in the request body only."""
        answer = await self._call(
            endpoint, "/v3/auth/authenticate", {"name": username, "password": password}
        )
        token = answer.get("token")
        if not isinstance(token, str) or not token or len(token) > 4096:
            raise EtcdInvalid(endpoint, "authenticate: no token in the answer")
        return token

    async def health(self, endpoint: str) -> EndpointHealth:
        """``GET /health``: true needs a leader, no alarm and a linearizable read (quorum).
        Anything else than etcd's health answer (200 or 503 with ``{"health": ...}``) raises
        ``EtcdInvalid``: the endpoint is not etcd, or not well."""
        status, data = await self._exchange("GET", endpoint, "/health", None)
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        value = answer.get("health") if isinstance(answer, dict) else None
        if status not in (200, 503) or value not in ("true", "false"):
            raise EtcdInvalid(endpoint, f"not an etcd health answer (HTTP {status})")
        assert isinstance(answer, dict)
        reason = answer.get("reason", "")
        reason = reason[:200] if isinstance(reason, str) else ""
        return EndpointHealth(endpoint, value == "true" and status == 200, reason)
