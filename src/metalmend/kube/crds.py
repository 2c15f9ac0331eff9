"""Install metalmend's CustomResourceDefinitions and wait until the API serves them."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.codecs import load_all_yaml
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition

from metalmend.api.resources import CRD_DIR

FIELD_MANAGER = "metalmend"


def load_crds(directory: Path = CRD_DIR) -> list[CustomResourceDefinition]:
    crds: list[CustomResourceDefinition] = []
    for path in sorted(directory.glob("*.yaml")):
        for obj in load_all_yaml(path.read_text()):
            if not isinstance(obj, CustomResourceDefinition):
                raise ValueError(f"{path} holds a {obj.kind}, not a CustomResourceDefinition")
            crds.append(obj)
    return crds


def crd_name(crd: CustomResourceDefinition) -> str:
    name = crd.metadata.name if crd.metadata else None
    if not name:
        raise ValueError("a CustomResourceDefinition without metadata.name")
    return name


def established(crd: CustomResourceDefinition) -> bool:
    conditions = (crd.status.conditions if crd.status else None) or []
    return any(c.type == "Established" and c.status == "True" for c in conditions)


def install_crds(client: Client, directory: Path = CRD_DIR, timeout: float = 180.0) -> list[str]:
    """Server-side apply every CRD in ``directory``; return their names once Established."""
    names = [
        crd_name(client.apply(crd, field_manager=FIELD_MANAGER, force=True))
        for crd in load_crds(directory)
    ]
    wait_established(client, names, timeout)
    wait_listed(client, names, timeout)
    return names


def wait_listed(client: Client, names: Sequence[str], timeout: float) -> None:
    """Until each CRD's objects can be listed: Established comes before the API server's
    cache of the new kind is filled, and meanwhile it answers 429 "storage is
    (re)initializing" (seen on a busy machine by the first create after the install)."""
    deadline = time.monotonic() + timeout
    for name in names:
        crd = client.get(CustomResourceDefinition, name)
        assert crd.spec is not None
        served = [v.name for v in crd.spec.versions if v.served]
        path = f"/apis/{crd.spec.group}/{served[0]}/{crd.spec.names.plural}?limit=1"
        generic: Any = client._client  # lightkube lists by kind only; its HTTP client by path
        while True:
            response = generic._client.get(path)
            if response.status_code == 200:
                break
            if time.monotonic() > deadline or response.status_code not in (404, 429, 503):
                raise TimeoutError(
                    f"CRD {name} established but its objects not listable after"
                    f" {timeout:.0f}s: {response.status_code} {response.text[:200]}"
                )
            time.sleep(0.1)


def wait_established(client: Client, names: Sequence[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pending = list(names)
    while pending:
        pending = [n for n in pending if not established(client.get(CustomResourceDefinition, n))]
        if not pending:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRDs not established after {timeout:.0f}s: {', '.join(pending)}")
        time.sleep(0.1)
