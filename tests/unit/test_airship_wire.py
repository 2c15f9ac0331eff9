"""The pure parts of Airship clients' wire contract (docs/airship-clients.md): which token
a request presents, notes in Shipyard's shape, the site-status filters."""

from __future__ import annotations

import datetime as dt

import pytest

from metalmend.siteactions.model import Action, Note, Step
from metalmend.siteactions.policy import statuses
from metalmend.siteactions.policy.actions import ActionLifecycle
from metalmend.web.auth import presented_token
from metalmend.web.status import StatusError

AT = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("authorization", "auth_token"),
    [
        ("Bearer abc", None),
        (None, "abc"),  # Shipyard's client
        ("", " abc "),
        ("Bearer abc", "abc"),  # both, the same token
    ],
)
def test_the_token_a_request_presents(authorization: str | None, auth_token: str | None) -> None:
    assert presented_token(authorization, auth_token) == "abc"


@pytest.mark.parametrize(
    ("authorization", "auth_token", "says"),
    [
        ("Bearer abc", "xyz", "two different tokens"),
        ("Basic dXNlcjpwdw==", "abc", "Kubernetes token"),  # a Basic header is no token
        (None, None, "X-Auth-Token"),
        (None, "  ", "X-Auth-Token"),
    ],
)
def test_no_token_or_two_are_refused(
    authorization: str | None, auth_token: str | None, says: str
) -> None:
    with pytest.raises(StatusError, match=says) as refused:
        presented_token(authorization, auth_token)
    assert refused.value.code == 401


def test_action_and_step_notes_carry_every_field_shipyards_client_prints() -> None:
    note = Note(AT, "design revision 3")
    step = Step("preflight", 0, notes=(note,))
    action = Action(
        id="01ABC", name="deploy_site", parameters={}, lifecycle=ActionLifecycle.COMPLETE,
        created=AT, updated=AT, user="u", context_marker=None, committed_rev_id=3,
        revision=3, allow_intermediate_commits=False, steps=(step,), notes=(note,),
    )  # fmt: skip
    wire = action.to_wire("/shipyard/api/v1.0/actions/01ABC")
    shown = wire["notes"][0]
    assert shown | {"note_id": "-"} == {
        "assoc_id": "action/01ABC", "subject": "01ABC", "sub_type": "action",
        "note_val": "design revision 3", "verbosity": 1, "note_id": "-",
        "note_timestamp": "2026-11-26T12:00:00Z", "resolved_url_value": None,
    }  # fmt: skip
    in_step = wire["steps"][0]["notes"][0]
    assert (in_step["assoc_id"], in_step["subject"], in_step["sub_type"]) == (
        "step/01ABC/preflight", "preflight", "step",
    )  # fmt: skip
    assert in_step == step.detail("01ABC")["notes"][0]
    assert shown["note_id"] != in_step["note_id"]
    assert len(shown["note_id"]) == 26
    # stored as before: a time and a text
    assert Note.from_wire(note.to_wire()) == note


@pytest.mark.parametrize(
    ("raw", "found"),
    [
        ([], statuses.FILTERS),
        (["machines-power-state"], ("machines-power-state",)),
        (["machines-power-state,nodes-provision-status"], statuses.FILTERS),  # Shipyard's order
        (["nodes-provision-status", "machines-power-state"], statuses.FILTERS),
        (["nodes-provision-status,"], ("nodes-provision-status",)),
        (["cpu"], "'cpu' is not supported"),
        (["x" * 300], "at most 256"),
    ],
)
def test_site_status_filters(raw: list[str], found: object) -> None:
    answer = statuses.filters(raw)
    if isinstance(answer, statuses.BadFilter):
        assert isinstance(found, str)
        assert found in answer.message
    else:
        assert answer == found


def test_shipyard_writes_code_as_its_status_line_the_other_apis_as_a_number() -> None:
    from metalmend.web import conventions
    from metalmend.web.status import body, errors

    refused = body(409, "Conflict", "no", errors("no"))
    shipyard = conventions.shaped("/shipyard/api/v1.0/configdocs/site", refused)
    assert (shipyard["code"], shipyard["errorType"], shipyard["retry"]) == (
        "409 Conflict",
        "ApiError",
        False,
    )
    assert shipyard["details"] == {**refused["details"], "errorType": "ApiError"}
    assert {
        k: v for k, v in shipyard.items() if k not in ("code", "errorType", "retry", "details")
    } == {k: v for k, v in refused.items() if k not in ("code", "details")}
    busy = conventions.shaped("/shipyard/api/v1.0/actions", body(503, "Unavailable", "later"))
    assert (busy["code"], busy["errorType"], busy["retry"]) == (
        "503 Service Unavailable",
        "AppError",
        True,
    )
    done = conventions.shaped("/shipyard/api/v1.0/commitconfigdocs", body(200, "Success", "ok"))
    assert done["code"] == "200 OK"
    assert "errorType" not in done
    assert "retry" not in done
    assert conventions.shaped("/deckhand/api/v1.0/revisions", refused) == refused
    assert conventions.shaped("/promenade/api/v1.0/nodes/n/drain", refused) == refused
    drydock = conventions.shaped("/drydock/api/v1.0/tasks", refused)
    assert (drydock["code"], drydock["type"], drydock["retry"]) == (409, "error", False)
    assert conventions.status_line(413) == "413 Payload Too Large"
    assert conventions.status_line(418) == "418 I'm a Teapot"


def test_the_last_action_per_host_is_the_newest_naming_it_or_a_site_action() -> None:
    from metalmend.siteactions.policy.statuses import ActionSeen, last_actions

    relabel = ActionSeen("01A", "relabel_nodes", "Complete", "t0", ("h1",))
    site = ActionSeen("01B", "deploy_site", "Complete", "t1")
    redeploy = ActionSeen("01C", "redeploy_server", "Failed", "t2", ("h2",))
    found = last_actions(["h1", "h2", "h3"], [redeploy, relabel, site])
    assert found == {"h1": site, "h2": redeploy, "h3": site}
    assert last_actions(["h1", "h9"], [relabel]) == {"h1": relabel, "h9": None}
