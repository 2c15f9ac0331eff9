"""Who is calling, and may they: Kubernetes bearer tokens checked with TokenReview, each
endpoint authorized with a SubjectAccessReview (docs/teardown.md, "Authorization").

Every endpoint names a ``Permission``: a verb on a resource of metalmend's API group
``promenade.metalmend.dev``, for the Node named in the path. RBAC rules grant them like any
other (deploy/rbac/serve.yaml); ``resourceNames`` may limit them to some Nodes. The API
server answers both reviews; metalmend keeps no users and no cache of answers, so a
revoked token or binding stops working at the next request.
"""

from __future__ import annotations

import logging
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

from metalmend.kube import errors
from metalmend.kube.impersonate import Who
from metalmend.log import fields
from metalmend.serve.status import StatusError

log = logging.getLogger(__name__)

API_GROUP = "promenade.metalmend.dev"


@dataclass(frozen=True)
class Permission:
    """What an endpoint asks RBAC: ``verb`` on ``resource/subresource`` in ``group``."""

    resource: str
    subresource: str
    verb: str
    group: str = API_GROUP

    def describe(self) -> str:
        resource = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {resource} ({self.group})"


# One per Promenade endpoint. POST to a step is "create" on the Node's subresource, as a
# POST to pods/eviction is in Kubernetes.
DRAIN = Permission("nodes", "drain", "create")
CLEAR_LABELS = Permission("nodes", "clear-labels", "create")
REMOVE_ETCD = Permission("nodes", "remove-etcd", "create")
SHUTDOWN_KUBELET = Permission("nodes", "shutdown-kubelet", "create")
REMOVE_FROM_CLUSTER = Permission("nodes", "remove-from-cluster", "create")
DECOMMISSION = Permission("nodes", "decommission", "create")
ETCD_HEALTH = Permission("etcdclusters", "health", "get")


@dataclass(frozen=True)
class Caller:
    username: str
    uid: str
    groups: tuple[str, ...]
    extra: dict[str, list[str]]

    def who(self) -> Who:
        """The caller as impersonation names them (kube.impersonate)."""
        return Who(
            self.username, self.uid, self.groups, {k: tuple(v) for k, v in self.extra.items()}
        )

    @classmethod
    def of(cls, who: Who) -> Caller:
        return cls(who.username, who.uid, who.groups, {k: list(v) for k, v in who.extra.items()})


def _unauthorized(detail: str) -> StatusError:
    return StatusError(401, "Unauthorized", f"Credentials are not established: {detail}")


def bearer_token(authorization: str | None) -> str:
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise _unauthorized("send a Kubernetes bearer token (Authorization: Bearer <token>)")
    return token.strip()


class Gate:
    """Authenticates and authorizes callers through the API server of ``client``."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    async def caller(self, authorization: str | None) -> Caller:
        token = bearer_token(authorization)
        review = await self._create(TokenReview(spec=TokenReviewSpec(token=token)))
        status = review.status
        if status is None or not status.authenticated or status.user is None:
            raise _unauthorized("the token is not valid (expired, revoked or unknown)")
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
            raise StatusError(
                403,
                "Forbidden",
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
    gate: Gate = request.app.state.services.gate
    header = f"{credentials.scheme} {credentials.credentials}" if credentials else None
    caller = await gate.caller(header)
    await gate.authorize(caller, permission, name)
    request.state.caller = caller  # who the teardown claim names (serve.interlock)
