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
from typing import Any

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import Status

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
