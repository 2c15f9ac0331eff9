"""The wire contract Airship's own clients depend on (docs/airship-clients.md), spoken as
Shipyard's command-line client speaks it, against the real serve app and the real API
server: the token as ``X-Auth-Token``, notes with every field the client prints, a step's
log as text, the site statuses with Shipyard's filters, each refused to a role without
its permission."""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

import yaml
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.rbac_authorization_v1 import ClusterRole

from metalmend.api.resources import BareMetalHost
from metalmend.db import Database
from metalmend.siteactions import model
from metalmend.siteactions.policy.actions import ActionLifecycle, new_action_id
from metalmend.siteactions.store import ActionStore
from metalmend_lab.controlplane import ControlPlane
from tests.integration.test_serve_promenade import bearer, lines, status_of, token
from tests.integration.test_shipyard_api import (
    YAML,
    Service,
    design,
    host_up,
    serve_kubeconfig,
    service,
    wait_for,
)

__all__ = ["serve_kubeconfig", "service"]

# Every field Shipyard's client reads from a note (its format_notes: a missing one prints
# "!!! Unparseable Note").
NOTE_FIELDS = {
    "assoc_id", "subject", "sub_type", "note_val", "verbosity", "note_id", "note_timestamp",
    "resolved_url_value",
}  # fmt: skip


def shipyard_client(value: str) -> dict[str, str]:
    """The headers Shipyard's client sends: its token as X-Auth-Token, no Authorization."""
    return {"X-Auth-Token": value, "X-Context-Marker": "1c4b6a5e-9d1f-4a57-8c3e-7c0b2b0d9a11"}


def action_reader(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """A token that may read actions, and nothing else: not their logs, not the site."""
    role = f"{namespace}-action-reader"
    kube.create(
        ClusterRole(
            metadata=ObjectMeta(name=role),
            rules=[PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["actions"],
                              verbs=["get", "list"])],
        )
    )  # fmt: skip
    return token(control_plane, kube, namespace, "action-reader", role)


def step_log_reader(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """A token that may read step logs (``get actions/logs``), and nothing else."""
    role = f"{namespace}-step-log-reader"
    kube.create(
        ClusterRole(
            metadata=ObjectMeta(name=role),
            rules=[PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["actions/logs"],
                              verbs=["get"])],
        )
    )  # fmt: skip
    return token(control_plane, kube, namespace, "step-log-reader", role)


async def test_shipyards_client_reads_actions_notes_and_step_logs_with_its_own_header(
    service: Service, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    redeployer = token(
        control_plane, kube, namespace, "site-redeployer", "metalmend-shipyard-redeployer"
    )
    reader = action_reader(control_plane, kube, namespace)
    log_reader = step_log_reader(control_plane, kube, namespace)
    other = token(control_plane, kube, namespace, "site-viewer", "metalmend-shipyard-viewer")
    async with service.running() as http:
        create = {"name": "redeploy_server", "parameters": {"target_nodes": "n1"}}
        answer = await http.post("/actions", headers=shipyard_client(redeployer), json=create)
        assert answer.status_code == 201, answer.text
        action_id = answer.json()["id"]
        found: dict[str, Any] = await wait_for(http, shipyard_client(redeployer), action_id)

        # the token in both headers: the same one is accepted, two different ones refused
        both = {**bearer(redeployer), "X-Auth-Token": redeployer}
        assert (await http.get(f"/actions/{action_id}", headers=both)).status_code == 200
        two = {**bearer(redeployer), "X-Auth-Token": other}
        refused = status_of(await http.get(f"/actions/{action_id}", headers=two), 401,
                            "Unauthorized")  # fmt: skip
        assert "two different tokens" in refused["message"]
        garbage = await http.get("/actions", headers=shipyard_client("not-a-token"))
        assert "not valid" in status_of(garbage, 401, "Unauthorized")["message"]

        # notes, action and step, in Shipyard's shape
        for note in found["notes"]:  # (an action's own notes: guards it was let past)
            assert set(note) == NOTE_FIELDS
            assert (note["sub_type"], note["subject"]) == ("action", action_id)
            assert note["assoc_id"] == f"action/{action_id}"
            assert note["verbosity"] == 1
            assert len(note["note_id"]) == 26
        lookup = next(s for s in found["steps"] if s["id"] == "design_lookup")
        note = lookup["notes"][-1]
        assert set(note) == NOTE_FIELDS
        assert note["assoc_id"] == f"step/{action_id}/design_lookup"
        assert (note["sub_type"], note["subject"]) == ("step", "design_lookup")
        assert note["note_val"].startswith("missing precondition:")
        again = (await http.get(f"/actions/{action_id}", headers=shipyard_client(reader))).json()
        step_again = next(s for s in again["steps"] if s["id"] == "design_lookup")
        assert step_again["notes"][-1]["note_id"] == note["note_id"]  # stable
        detail = await http.get(
            f"/actions/{action_id}/steps/design_lookup", headers=shipyard_client(reader)
        )
        assert detail.json()["notes"][-1] == note

        # the step's log: text, its notes in order
        logs = await http.get(
            f"/actions/{action_id}/steps/design_lookup/logs", headers=shipyard_client(redeployer)
        )
        assert logs.status_code == 200, logs.text
        assert logs.headers["content-type"].startswith("text/plain")
        assert logs.text.startswith(f"action {action_id} step design_lookup: failed")
        assert note["note_val"] in logs.text
        # the try as Shipyard's client sends it (`--try=N`: the query's `try`)
        for name in ("try", "try_number"):
            tried = await http.get(
                f"/actions/{action_id}/steps/design_lookup/logs",
                headers=shipyard_client(redeployer), params={name: "7"},
            )  # fmt: skip
            assert "keeps the latest try" in status_of(tried, 404, "NotFound")["message"]
        latest = await http.get(
            f"/actions/{action_id}/steps/design_lookup/logs",
            headers=shipyard_client(redeployer), params={"try": "1"},
        )  # fmt: skip
        assert latest.text == logs.text
        # the try given twice, or under both its names: refused, not read as the last
        # (issue 36, point 8), from a role that may read step logs and nothing else
        for twice, words in (
            ([("try", "1"), ("try", "2")], "query parameter 'try' is given more than once"),
            ([("try_number", "2"), ("try_number", "1")],
             "query parameter 'try_number' is given more than once"),
            ([("try", "1"), ("try_number", "1")], "try or as try_number, not both"),
        ):  # fmt: skip
            refused = await http.get(
                f"/actions/{action_id}/steps/design_lookup/logs",
                headers=shipyard_client(log_reader), params=twice,
            )  # fmt: skip
            assert words in status_of(refused, 400, "BadRequest")["message"], twice
        alone = await http.get(
            f"/actions/{action_id}/steps/design_lookup/logs", headers=shipyard_client(log_reader)
        )
        assert alone.text == logs.text  # the role reaches the log itself
        missing = await http.get(
            f"/actions/{action_id}/steps/nope/logs", headers=shipyard_client(redeployer)
        )
        status_of(missing, 404, "NotFound")
        # a note's details (`shipyard describe notedetails/ID`): Shipyard's answers for an
        # id of the wrong length, an unknown note, and a note with no URL to resolve
        details = await http.get(f"/notedetails/{note['note_id']}", headers=shipyard_client(reader))
        none = status_of(details, 404, "NotFound")
        assert none["message"] == "No further note details are available"
        assert lines(none) == [f"Note {note['note_id']} has no additional information to return"]
        unknown = await http.get(f"/notedetails/{'A' * 26}", headers=shipyard_client(reader))
        assert status_of(unknown, 404, "NotFound")["message"] == "No note found"
        short = await http.get("/notedetails/abc", headers=shipyard_client(reader))
        assert "26 character" in status_of(short, 400, "BadRequest")["message"]
        nobody = await http.get(f"/notedetails/{note['note_id']}", headers=shipyard_client("x"))
        status_of(nobody, 401, "Unauthorized")
        # reading actions is not reading their logs
        denied = await http.get(
            f"/actions/{action_id}/steps/design_lookup/logs", headers=shipyard_client(reader)
        )
        assert "get actions/logs" in status_of(denied, 403, "Forbidden")["message"]


def stored_actions(
    url: str, *wanted: tuple[str, dict[str, Any], ActionLifecycle]
) -> list[model.Action]:
    """Finished actions stored as the worker leaves them, one second apart, oldest first."""
    database = Database.open(url)
    database.upgrade()
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    made = []
    for i, (name, parameters, lifecycle) in enumerate(wanted):
        at = start + dt.timedelta(seconds=i)
        made.append(
            model.Action(
                id=new_action_id(at, os.urandom(10)), name=name, parameters=parameters,
                lifecycle=lifecycle, created=at, updated=at, user="someone",
                context_marker=None, committed_rev_id=1, revision=1,
                allow_intermediate_commits=False,
            )
        )  # fmt: skip
        ActionStore(database).create(made[-1])
    database.dispose()
    return made


def site_status_reader(control_plane: ControlPlane, kube: Client, namespace: str) -> str:
    """A token that may read the site statuses, and not the actions."""
    role = f"{namespace}-status-reader"
    kube.create(
        ClusterRole(
            metadata=ObjectMeta(name=role),
            rules=[PolicyRule(apiGroups=["shipyard.metalmend.dev"], resources=["sitestatuses"],
                              verbs=["get"])],
        )
    )  # fmt: skip
    return token(control_plane, kube, namespace, "status-reader", role)


async def test_site_statuses_with_shipyards_filters(
    service: Service, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    viewer = token(control_plane, kube, namespace, "site-viewer", "metalmend-shipyard-viewer")
    reader = action_reader(control_plane, kube, namespace)
    for name in ("h1", "h2"):
        kube.create(
            BareMetalHost(metadata=ObjectMeta(name=name, namespace=namespace),
                          spec={"online": True})
        )  # fmt: skip
    host_up(kube, namespace, "h2")
    # finished actions, oldest first: a relabel of h1, a deploy_site (every host), a
    # redeploy of h2; the last action of h1 is the deploy, of h2 the redeploy
    stored = stored_actions(
        service.url,
        ("relabel_nodes", {"target_nodes": ["h1"]}, ActionLifecycle.COMPLETE),
        ("deploy_site", {}, ActionLifecycle.COMPLETE),
        ("redeploy_server", {"target_nodes": ["h2"]}, ActionLifecycle.FAILED),
    )
    statuses_only = site_status_reader(control_plane, kube, namespace)
    async with service.running() as http:
        both = await http.get("/site_statuses", headers=shipyard_client(viewer))
        assert both.status_code == 200, both.text
        deploy, redeploy = stored[1], stored[2]
        assert both.json() == {
            "nodes_provision_status": [
                {"hostname": "h1", "status": "unknown", "namespace": namespace,
                 "last_action": {"id": deploy.id, "name": "deploy_site",
                                 "action_lifecycle": "Complete",
                                 "created_at": model.iso(deploy.created)}},
                {"hostname": "h2", "status": "provisioned", "namespace": namespace,
                 "last_action": {"id": redeploy.id, "name": "redeploy_server",
                                 "action_lifecycle": "Failed",
                                 "created_at": model.iso(redeploy.created)}},
            ],
            "machines_powerstate": [
                {"hostname": "h1", "power_state": "unknown", "namespace": namespace},
                {"hostname": "h2", "power_state": "On", "namespace": namespace},
            ],
        }  # fmt: skip
        # who may read the site but not list actions sees no action
        unlisted = await http.get("/site_statuses", headers=shipyard_client(statuses_only))
        assert unlisted.status_code == 200, unlisted.text
        assert all("last_action" not in row for row in unlisted.json()["nodes_provision_status"])
        power = await http.get(
            "/site_statuses", headers=shipyard_client(viewer),
            params={"filters": "machines-power-state"},
        )  # fmt: skip
        assert list(power.json()) == ["machines_powerstate"]
        listed = await http.get(
            "/site_statuses?filters=nodes-provision-status%2Cmachines-power-state",
            headers=shipyard_client(viewer),
        )
        assert list(listed.json()) == ["nodes_provision_status", "machines_powerstate"]
        bad = await http.get(
            "/site_statuses", headers=shipyard_client(viewer), params={"filters": "cpu-temp"}
        )
        assert "supported: nodes-provision-status" in status_of(bad, 400, "BadRequest")["message"]
        denied = await http.get("/site_statuses", headers=shipyard_client(reader))
        assert "get sitestatuses" in status_of(denied, 403, "Forbidden")["message"]


async def test_configdocs_and_actions_as_shipyards_client_expects_them(
    service: Service, control_plane: ControlPlane, kube: Client, namespace: str
) -> None:
    admin = token(control_plane, kube, namespace, "site-admin", "metalmend-shipyard-admin")
    who = {**shipyard_client(admin), **YAML}
    async with service.running() as http:
        # the services' health and versions, no token needed
        for name in ("shipyard", "deckhand", "drydock", "promenade"):
            health = await http.get(f"http://serve/{name}/api/v1.0/health")
            assert (health.status_code, health.content) == (204, b"")
            versions = await http.get(f"http://serve/{name}/versions")
            assert versions.json() == {"v1.0": {"path": f"/{name}/api/v1.0", "status": "stable"}}
        put = await http.post("/configdocs/site", content=design(namespace, ["h1"]), headers=who)
        assert put.status_code == 201, put.text
        assert put.json()["code"] == "201 Created"  # Shipyard's success Status bodies too
        # Deckhand's status on each document read through configdocs
        found = [
            d
            for d in yaml.safe_load_all((await http.get("/configdocs/site", headers=who)).text)
            if d
        ]
        assert {(d["status"]["bucket"], d["status"]["revision"]) for d in found} == {("site", 1)}
        rendered = await http.get("/renderedconfigdocs", headers=who)
        assert all(d["status"]["bucket"] == "site" for d in yaml.safe_load_all(rendered.text) if d)
        # a second collection: the CLI's words in the refusal
        refused = await http.post(
            "/configdocs/other", content=design(namespace, ["h2"]), headers=who
        )
        message = status_of(refused, 409, "Conflict")["message"]
        assert "shipyard commit configdocs" in message
        assert "--append" in message
        # append onto a collection the buffer already holds: 409, as Shipyard
        again = await http.post(
            "/configdocs/site", content=design(namespace, ["h3"]), headers=who,
            params={"buffermode": "append"},
        )  # fmt: skip
        conflict = status_of(again, 409, "Conflict")
        assert "already in the buffer" in conflict["message"]
        # Shipyard's own error fields beside the Status ones; Drydock's on its routes
        assert (conflict["errorType"], conflict["retry"]) == ("ApiError", False)
        assert (conflict["code"], conflict["details"]["errorType"]) == ("409 Conflict", "ApiError")
        assert {"errorCount", "messageList"} <= set(conflict["details"])  # Status fields kept
        drydock = await http.get(
            "http://serve/drydock/api/v1.0/tasks/nope", headers=shipyard_client("bad")
        )
        refused_here = status_of(drydock, 401, "Unauthorized")
        assert (refused_here["type"], refused_here["retry"]) == ("error", False)
        assert "errorType" not in refused_here
        assert refused_here["code"] == 401  # a number on every route but Shipyard's
        # parameters: continue-on-fail true and false accepted (refused later: nothing
        # committed), anything else refused by name
        for value in ("false", "true"):
            kept = {"name": "update_site", "parameters": {"continue-on-fail": value}}
            answer = await http.post("/actions", headers=shipyard_client(admin), json=kept)
            assert "shipyard commit configdocs" in status_of(answer, 400, "BadRequest")["message"]
        maybe = {"name": "update_site", "parameters": {"continue-on-fail": "maybe"}}
        answer = await http.post("/actions", headers=shipyard_client(admin), json=maybe)
        assert "must be true or false" in status_of(answer, 400, "BadRequest")["message"]
        # Shipyard's actions a site without Armada cannot run: as Shipyard answers an
        # action it does not have, saying why
        for name, why in (("test_site", "Helm tests"), ("update_software", "has no Armada")):
            answer = await http.post(
                "/actions", headers=shipyard_client(admin), json={"name": name}
            )
            document = status_of(answer, 400, f"Unsupported Action: {name}")
            assert document["message"] == "Unable to start action"
            assert why in lines(document)[0]
        typo = {"name": "deploy_site", "parameters": {"contnue-on-fail": "true"}}
        answer = await http.post("/actions", headers=shipyard_client(admin), json=typo)
        assert "'contnue-on-fail'" in status_of(answer, 400, "BadRequest")["message"]
        # a dry run of a buffer that does not validate: 200 with the problems
        outside = await http.post(
            "/configdocs/site", content=design("kube-system", ["h1"]), headers=who,
            params={"buffermode": "replace"},
        )  # fmt: skip
        assert outside.status_code == 201, outside.text
        dry = await http.post(
            "/commitconfigdocs", headers=shipyard_client(admin), params={"dryrun": "true"}
        )
        document = status_of(dry, 200, "Success")
        assert document["code"] == "200 OK"
        assert "does not validate" in document["message"]
        assert any("kube-system" in line for line in lines(document))
        # each problem an Airship ValidationMessage: the client prints "- level: name"
        # and counts the levels; without them it printed "- None: None", counted nothing
        for problem in document["details"]["messageList"]:
            assert problem["kind"] == "ValidationMessage"
            assert (problem["level"], problem["error"]) == ("Error", True)
            assert problem["name"] == "metalmend-site-design"
            assert problem["documents"] == []
        refused = await http.post("/commitconfigdocs", headers=shipyard_client(admin))
        problems = status_of(refused, 400, "BadRequest")["details"]["messageList"]
        assert {(p["kind"], p["level"]) for p in problems} == {("ValidationMessage", "Error")}
