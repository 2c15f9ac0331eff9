"""A site action's wait against the real API server (issue 27, point 8): a design host
in error fails it at once with the host's message, and a stop through the API interrupts
it and stays stopped across a restart of the service. The wait is configured for hours:
each test ends long before it could time out."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Secret
from lightkube.types import PatchType

from metalmend.api.resources import BareMetalHost
from metalmend.db import Database
from metalmend.designs.store import DesignStore
from metalmend.siteactions.policy.redeploy import RedeploySettings
from tests.integration.test_serve_promenade import status_of
from tests.integration.test_shipyard_api import (
    Service,
    admin,
    design,
    put,
    redeployer,
    serve_kubeconfig,
    service,
    wait_for,
)

__all__ = ["admin", "redeployer", "serve_kubeconfig", "service"]

HOURS = RedeploySettings(provision_timeout=3600, node_ready_timeout=3600, poll_interval=0.2)
UNBOUND = (
    "Secret {ns}/{name}-bmc is not bound to any host: an operator who may edit it adds"
    " annotation metalmend.dev/hosts"
)


@pytest.fixture
def hours(service: Service) -> Service:
    return dataclasses.replace(service, timing=HOURS)


async def waiting(http: httpx.AsyncClient, who: dict[str, str], action_id: str) -> None:
    """Until the wait step has looked at the site once (its first note)."""
    async with asyncio.timeout(60):
        while True:
            step = await http.get(f"/actions/{action_id}/steps/wait", headers=who)
            notes = [n["note_val"] for n in step.json().get("notes", [])]
            if any(n.startswith("waiting for") for n in notes):
                return
            await asyncio.sleep(0.1)


async def deploy(
    http: httpx.AsyncClient, who: dict[str, str], kube: Client, namespace: str, name: str
) -> str:
    kube.create(Secret(  # labelled and bound: what host-power (and validation) uses
        metadata=ObjectMeta(name=f"{name}-bmc", namespace=namespace,
                            labels={"metalmend.dev/bmc-credentials": "true"},
                            annotations={"metalmend.dev/bmc-hosts": name}),
        stringData={"username": "u", "password": "p"}))  # fmt: skip
    await put(http, who, "site", design(namespace, [name]))
    await http.post("/commitconfigdocs", headers=who)
    answer = await http.post("/actions", headers=who, json={"name": "deploy_site"})
    assert answer.status_code == 201, answer.text
    action_id: str = answer.json()["id"]
    await waiting(http, who, action_id)
    return action_id


def steps_of(action: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in action["steps"]}


async def test_a_design_host_in_error_fails_the_wait_at_once_with_its_message(
    hours: Service, admin: dict[str, str], kube: Client, namespace: str
) -> None:
    """Issue 27, point 8: a design host whose Secret is not bound left the wait to its
    whole timeout (240 s in a lab, 5,400 s by default); host-power's error now fails it
    at once, saying what the host says."""
    name = f"{namespace[:40]}-h"
    async with hours.running() as http:
        action_id = await deploy(http, admin, kube, namespace, name)
        message = UNBOUND.format(ns=namespace, name=name)
        status = {
            "errorType": "registration error",
            "errorMessage": message,
            "errorCount": 1,
            "operationalStatus": "error",
        }  # as host-power writes it
        kube.patch(BareMetalHost.Status, name, {"status": status}, namespace=namespace,
                   patch_type=PatchType.MERGE)  # fmt: skip
        done = await wait_for(http, admin, action_id)  # within 60 s; the wait: 2 hours
        assert done["action_lifecycle"] == "Failed", done
        wait = steps_of(done)["wait"]
        assert wait["state"] == "failed"
        assert wait["notes"][-1]["note_val"] == (
            f"BareMetalHost {namespace}/{name}: registration error: {message}"
        )
        tag = steps_of(done)["create_action_tag"]["notes"][-1]["note_val"]
        assert tag == "design revision 1 tagged site-action-failure"


async def test_stop_through_the_api_interrupts_the_wait_and_stays_stopped_after_a_restart(
    hours: Service,
    admin: dict[str, str],
    redeployer: dict[str, str],
    kube: Client,
    namespace: str,
) -> None:
    """Issue 27, point 8: stop waited for the running step (109 s in a lab, while every
    other action got 409). Asked by the narrowest role that may (the redeployer's
    ``create actions/control``), it ends the wait; a restarted service leaves it so."""
    name = f"{namespace[:40]}-h"
    async with hours.running() as http:
        action_id = await deploy(http, admin, kube, namespace, name)
        stop = await http.post(f"/actions/{action_id}/control/stop", headers=redeployer)
        assert (
            "the running step ends at its next wait" in status_of(stop, 202, "Accepted")["message"]
        )
        done = await wait_for(http, admin, action_id)  # within 60 s; the wait: 2 hours
        assert done["action_lifecycle"] == "Failed", done
        assert done["stop_requested_by"] == f"system:serviceaccount:{namespace}:site-redeployer"
        steps = steps_of(done)
        assert [steps[s]["state"] for s in ("validation", "apply", "wait")] == [
            "success", "success", "shutdown",
        ]  # fmt: skip
        assert steps["wait"]["notes"][-1]["note_val"].endswith(": interrupted while it waited")
        tag = steps["create_action_tag"]["notes"][-1]["note_val"]
        assert tag == "design revision 1 tagged site-action-failure"
    async with hours.running() as http:  # a restart: nothing is run again
        after = (await http.get(f"/actions/{action_id}", headers=admin)).json()
        assert steps_of(after) == steps
        assert after["action_lifecycle"] == "Failed"
        refused = await http.post(f"/actions/{action_id}/control/stop", headers=redeployer)
        assert "cannot be stopped" in status_of(refused, 409, "Conflict")["message"]
    store = DesignStore(Database.open(hours.url))
    assert "site-action-failure" in store.tags(1)
