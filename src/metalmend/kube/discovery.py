"""Whether the API server serves a kind: its discovery document, one GET of
``/apis/<group>/<version>``.

Discovery needs no RBAC of its own (every authenticated identity may read it, the
``system:discovery`` role), so asking costs a controller nothing to configure, unlike a
watch on CustomResourceDefinitions. It is how a controller reads a kind it does not ship
(Cluster API's Cluster) only where that kind exists: an informer started for a kind that
is not served would retry, and warn, forever.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.authorization_v1 import ResourceAttributes, SelfSubjectAccessReviewSpec
from lightkube.models.meta_v1 import Status
from lightkube.resources.authorization_v1 import SelfSubjectAccessReview

from metalmend.kube import errors
from metalmend.log import fields

log = logging.getLogger(__name__)


async def serves(client: AsyncClient, group_version: str, plural: str) -> bool | None:
    """True when ``group_version`` (``cluster.x-k8s.io/v1beta1``) has the resource
    ``plural``; False when the API server says it has not (the group or version is not
    served, or lacks it); None when it cannot tell now (unreachable, a 5xx): the caller
    keeps what it knew."""
    generic: Any = client._client  # lightkube has no discovery call; its HTTP client has
    path = f"/apis/{group_version}" if "/" in group_version else f"/api/{group_version}"
    try:
        response = await generic._client.get(path)
        if response.is_error:  # JSON Status or "404 page not found": only the code counts
            status = Status(code=response.status_code, message=response.reason_phrase)
            raise ApiError(status=status)
        document = response.json()
    except ApiError as error:
        if errors.is_not_found(error):
            return False
        log.debug("discovery failed", extra=fields(path=path, error=str(error.status.message)))
        return None
    except (httpx2.HTTPError, OSError, ValueError) as error:
        log.debug("discovery failed", extra=fields(path=path, error=str(error)))
        return None
    resources = document.get("resources") if isinstance(document, dict) else None
    return isinstance(resources, list) and any(
        isinstance(r, dict) and r.get("name") == plural for r in resources
    )


def kind_of(resource: Any) -> tuple[str, str, str]:
    """(group, version, plural) of a lightkube resource class (group "" for core)."""
    info = resource._api_info
    return info.resource.group, info.resource.version, info.plural


async def unserved(client: AsyncClient, resources: Iterable[Any]) -> list[tuple[str, str, str]]:
    """The kinds among ``resources`` the API server says it does not serve (a kind it cannot
    tell about now counts as served: the informer will retry and say why)."""
    missing = []
    for group, version, plural in sorted({kind_of(r) for r in resources}):
        group_version = f"{group}/{version}" if group else version
        if await serves(client, group_version, plural) is False:
            missing.append((group, version, plural))
    return missing


def unserved_refusal(missing: Mapping[tuple[str, str, str], Sequence[str]]) -> str:
    """One line for the operator: the kinds not served, who needs them, and the fix."""
    kinds = ", ".join(
        f"{plural}.{group}/{version} (for {', '.join(needers)})"
        for (group, version, plural), needers in missing.items()
    )
    ours = [f"deploy/crds/{group}_{plural}.yaml" for group, _, plural in missing if group]
    fix = (
        f"install metalmend's CRDs: kubectl apply --server-side -f {' -f '.join(ours)}"
        " (Helm installs a chart's CRDs on the first install only, never on an upgrade;"
        " docs/install.md, 'Helm chart')"
        if ours
        else "run only the controllers this cluster has kinds for"
    )
    return f"the API server does not serve {kinds}: {fix}"


def gone_line(group: str, version: str, plural: str) -> str:
    """One line for /readyz and the log when a kind a running informer watches is no
    longer served (its CustomResourceDefinition deleted): which kind, and the fix."""
    kind = f"{plural}.{group}/{version}" if group else f"{plural}/{version}"
    fix = (
        f"reinstall it: kubectl apply --server-side -f deploy/crds/{group}_{plural}.yaml"
        if group
        else "a core kind: check the API server's --runtime-config"
    )
    return (
        f"the API server no longer serves {kind} (its CustomResourceDefinition was deleted?):"
        f" {fix}; metalmend watches it again by itself once it is served"
    )


async def may_read(client: AsyncClient, resource: Any, namespace: str | None = None) -> bool | None:
    """Whether this identity may list and watch ``resource`` (in ``namespace``, or in every
    namespace): a SelfSubjectAccessReview per verb, which every authenticated identity may
    create. None when it cannot tell now (the caller keeps the kind: its informer then says
    what it was refused)."""
    group, _, plural = kind_of(resource)
    for verb in ("list", "watch"):
        review = SelfSubjectAccessReview(
            spec=SelfSubjectAccessReviewSpec(
                resourceAttributes=ResourceAttributes(
                    group=group, resource=plural, verb=verb, namespace=namespace
                )
            )
        )
        try:
            answer: Any = await client.create(review)
        except (ApiError, httpx2.HTTPError, OSError) as error:
            log.debug("access review failed", extra=fields(resource=plural, error=str(error)))
            return None
        if not (answer.status and answer.status.allowed):
            return False
    return True
