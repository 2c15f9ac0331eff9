"""Site actions' rules (docs/site-actions.md) as tables: the versions Shipyard locates by
tags, the intermediate-commit guard as Airship's node teardown spec words it, the tags
after an action, redeploy_server's parameters, configdocs status between two versions,
and action ids. No I/O."""

from __future__ import annotations

import datetime as dt

import pytest

from metalmend.designs.rules import bucket_diff
from metalmend.siteactions.policy.actions import (
    FAILURE_TAG,
    INTERMEDIATE_COMMIT,
    SUCCESS_TAG,
    Absent,
    ActionLifecycle,
    ActionName,
    Allowed,
    BadParameters,
    BadRequest,
    Comparison,
    History,
    MissingPrecondition,
    NotFound,
    RedeployParameters,
    Refused,
    TagRevision,
    Version,
    boolean_parameter,
    compare,
    compared_versions,
    completion_tag,
    configdocs_status,
    guard,
    intermediate_commits,
    is_action_id,
    locate,
    new_action_id,
    redeploy_design,
    redeploy_parameters,
    version_named,
)

C, RC, OK, KO = "committed", "rollback_commit", SUCCESS_TAG, FAILURE_TAG


def history(*tags: tuple[str, ...]) -> History:
    """Revisions 1..n with these tags (oldest first, as one reads a history)."""
    return History.of((number, names) for number, names in enumerate(tags, start=1))


# --- versions ------------------------------------------------------------------------

VERSIONS = [
    # (id, history, version, expected revision or None for absent)
    ("empty store: no buffer", history(), Version.BUFFER, None),
    ("empty store: nothing committed", history(), Version.COMMITTED, None),
    ("uncommitted put is the buffer", history(()), Version.BUFFER, 1),
    ("newest committed: no buffer", history((C,)), Version.BUFFER, None),
    ("buffer is the newest when newer than committed", history((C,), (), ()), Version.BUFFER, 3),
    ("committed is the newest committed", history((C,), (C,), ()), Version.COMMITTED, 2),
    ("rollback_commit counts as committed", history((C,), (RC,), ()), Version.COMMITTED, 2),
    ("last site action takes success", history((C, OK), (C,)), Version.LAST_SITE_ACTION, 1),
    ("last site action takes failure", history((C, OK), (C, KO)), Version.LAST_SITE_ACTION, 2),
    (
        "successful site action skips failures",
        history((C, OK), (C, KO)),
        Version.SUCCESSFUL_SITE_ACTION,
        1,
    ),
    ("no success tag: absent", history((C, KO)), Version.SUCCESSFUL_SITE_ACTION, None),
    ("no site action tag: absent", history((C,), ()), Version.LAST_SITE_ACTION, None),
]


@pytest.mark.parametrize(
    ("revisions", "version", "expected"),
    [case[1:] for case in VERSIONS],
    ids=[case[0] for case in VERSIONS],
)
def test_a_version_is_the_newest_revision_with_its_tags(
    revisions: History, version: Version, expected: int | None
) -> None:
    found = locate(revisions, version)
    if expected is None:
        assert isinstance(found, Absent)
        assert found.version is version
        assert found.reason
    else:
        assert found == expected


def test_history_order_does_not_depend_on_input_order() -> None:
    assert History.of([(1, [C]), (3, []), (2, [C])]) == History.of([(3, []), (2, [C]), (1, [C])])
    assert locate(History.of([(3, []), (1, [C])]), Version.BUFFER) == 3


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("buffer", Version.BUFFER),
        ("last_site_action", Version.LAST_SITE_ACTION),
        ("successful-site-action", Version.SUCCESSFUL_SITE_ACTION),
        (" Committed ", Version.COMMITTED),
    ],
    ids=["underscore", "underscore site action", "hyphenated as the spec", "case and spaces"],
)
def test_a_version_name_is_read(raw: str, expected: Version) -> None:
    assert version_named(raw) is expected


@pytest.mark.parametrize(
    "raw", ["latest", "", 3, None, ["buffer"], "x" * 100_000], ids=lambda r: repr(r)[:20]
)
def test_an_unknown_version_names_the_valid_ones_without_echoing_huge_input(raw: object) -> None:
    message = version_named(raw)
    assert isinstance(message, str)
    assert "successful_site_action, last_site_action, committed, buffer" in message
    assert len(message) < 300


# --- the intermediate-commit guard ----------------------------------------------------

GUARD = [
    # (id, history, current revision, intermediate revisions found)
    ("first deploy, one commit: nothing between 0 and it", history((C,)), 1, ()),
    ("first deploy after two commits: revision 0 is the base", history((C,), (C,)), 2, (1,)),
    ("commit after a site action: fine", history((C, OK), (C,)), 2, ()),
    ("two commits since a success", history((C, OK), (C,), (C,)), 3, (2,)),
    ("two commits since a failure", history((C, KO), (C,), (C,)), 3, (2,)),
    ("buffer revisions are not commits", history((C, OK), (), (), (C,)), 4, ()),
    ("a rollback commit counts", history((C, OK), (RC,), (C,)), 3, (2,)),
    ("several piled up: all listed", history((C, OK), (C,), (), (C,), (C,)), 5, (2, 4)),
    ("redeploying the tagged revision itself", history((C, OK)), 1, ()),
    ("retrying a failed revision", history((C, OK), (C, KO)), 2, ()),
    ("only since the newest site action", history((C,), (C, OK), (C,)), 3, ()),
]


@pytest.mark.parametrize(
    ("revisions", "current", "expected"),
    [case[1:] for case in GUARD],
    ids=[case[0] for case in GUARD],
)
def test_intermediate_commits_are_untagged_commits_since_the_last_site_action(
    revisions: History, current: int, expected: tuple[int, ...]
) -> None:
    assert intermediate_commits(revisions, current) == expected
    for action in (ActionName.DEPLOY_SITE, ActionName.UPDATE_SITE):
        verdict = guard(action, revisions, current, allow_intermediate_commits=False)
        assert isinstance(verdict, Refused if expected else Allowed)


def test_a_refusal_says_intermediate_commit_detected_and_lists_the_revisions() -> None:
    verdict = guard(ActionName.DEPLOY_SITE, history((C, OK), (C,), (C,), (C,)), 4, False)
    assert isinstance(verdict, Refused)
    assert verdict.title == INTERMEDIATE_COMMIT == "Intermediate commit detected"
    assert verdict.intermediate == (2, 3)
    assert "2, 3" in verdict.message
    assert "revision 1" in verdict.message
    assert "allow-intermediate-commits=true" in verdict.message


def test_allow_intermediate_commits_allows_and_logs_that_the_check_was_skipped() -> None:
    verdict = guard(ActionName.UPDATE_SITE, history((C,), (C,), (C,)), 3, True)
    assert isinstance(verdict, Allowed)
    assert verdict.log is not None
    assert "skipped" in verdict.log


def test_redeploy_server_is_not_guarded() -> None:
    # The spec guards "deploy site or update site requests"; a redeploy uses a tagged revision.
    verdict = guard(ActionName.REDEPLOY_SERVER, history((C,), (C,), (C,)), 3, False)
    assert verdict == Allowed()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, False), (True, True), (False, False), ("true", True), ("FALSE", False)],
    ids=["absent: default", "json true", "json false", "cli true", "cli any case"],
)
def test_allow_intermediate_commits_is_a_boolean(raw: object, expected: bool) -> None:
    assert boolean_parameter("allow-intermediate-commits", raw, False) is expected


@pytest.mark.parametrize("raw", ["yes", 1, "", [True], "t" * 10_000], ids=repr)
def test_a_non_boolean_is_a_clear_message(raw: object) -> None:
    message = boolean_parameter("allow-intermediate-commits", raw, False)
    assert isinstance(message, str)
    assert "must be true or false" in message
    assert len(message) < 200


# --- tags after an action ---------------------------------------------------------------

TAGS = [
    # (id, action, validated, succeeded, expected tag or None)
    ("success tags success", ActionName.DEPLOY_SITE, True, True, SUCCESS_TAG),
    ("failure after validation tags failure", ActionName.UPDATE_SITE, True, False, FAILURE_TAG),
    ("failure in validation leaves no tag", ActionName.DEPLOY_SITE, False, False, None),
    ("redeploy_server never tags", ActionName.REDEPLOY_SERVER, True, True, None),
]


@pytest.mark.parametrize(
    ("action", "validated", "succeeded", "tag"),
    [case[1:] for case in TAGS],
    ids=[case[0] for case in TAGS],
)
def test_a_site_action_tags_its_revision_with_its_dag_id(
    action: ActionName, validated: bool, succeeded: bool, tag: str | None
) -> None:
    found = completion_tag(action, 7, "deploy_site_01J", validated, succeeded)
    if tag is None:
        assert found is None
    else:
        assert found == TagRevision(7, tag, {"dag_id": "deploy_site_01J"})


def test_a_revision_may_carry_both_outcomes() -> None:
    failed = completion_tag(ActionName.DEPLOY_SITE, 3, "a", validated=True, succeeded=False)
    retried = completion_tag(ActionName.DEPLOY_SITE, 3, "b", validated=True, succeeded=True)
    assert failed is not None
    assert retried is not None
    tagged = history((C,), (), (C, failed.tag, retried.tag))
    assert locate(tagged, Version.LAST_SITE_ACTION) == 3
    assert locate(tagged, Version.SUCCESSFUL_SITE_ACTION) == 3


# --- redeploy_server's parameters ---------------------------------------------------------

PARAMETERS = [
    (
        "defaults: wipe everything, last known good design",
        {"target_nodes": ["node-1"]},
        RedeployParameters(("node-1",), False, Version.SUCCESSFUL_SITE_ACTION),
    ),
    (
        "the CLI's comma string",
        {"target_nodes": "node-1, node-2"},
        RedeployParameters(("node-1", "node-2")),
    ),
    ("duplicates once", {"target_nodes": ["n1", "n1"]}, RedeployParameters(("n1",))),
    (
        "preserve and committed as strings",
        {"target_nodes": "n1", "preserve-local-storage": "true", "target-revision": "committed"},
        RedeployParameters(("n1",), True, Version.COMMITTED),
    ),
    (
        "json boolean and last site action",
        {
            "target_nodes": ["n1"],
            "preserve-local-storage": True,
            "target-revision": "last-site-action",
        },
        RedeployParameters(("n1",), True, Version.LAST_SITE_ACTION),
    ),
]


@pytest.mark.parametrize(
    ("raw", "expected"), [c[1:] for c in PARAMETERS], ids=[c[0] for c in PARAMETERS]
)
def test_redeploy_parameters_are_read(raw: object, expected: RedeployParameters) -> None:
    assert redeploy_parameters(raw) == expected


HOSTILE = [
    ("not a mapping", ["node-1"], "must be a mapping"),
    ("no node", {}, "target_nodes is required"),
    ("empty node list", {"target_nodes": []}, "is empty"),
    ("empty entry in the comma string", {"target_nodes": "n1,,n2"}, "is not a node name"),
    ("node is a number", {"target_nodes": [3]}, "is not a node name"),
    ("nodes is a mapping", {"target_nodes": {"n1": 1}}, "must be a list"),
    ("uppercase node name", {"target_nodes": ["Node1"]}, "is not a node name"),
    ("huge node name", {"target_nodes": "n" * 1_000_000}, "is not a node name"),
    ("too many nodes", {"target_nodes": [f"n{i}" for i in range(65)]}, "at most 64"),
    (
        "preserve not a boolean",
        {"target_nodes": "n1", "preserve-local-storage": "yes"},
        "preserve-local-storage must be true or false",
    ),
    (
        "unknown target revision",
        {"target_nodes": "n1", "target-revision": "buffer"},
        "target-revision must be committed | successful-site-action | last-site-action",
    ),
    (
        "target revision not a string",
        {"target_nodes": "n1", "target-revision": ["committed"]},
        "target-revision must be",
    ),
    (
        "a typo is not silently the default",
        {"target_nodes": "n1", "preserve_local_storage": "true"},
        "has no parameter 'preserve_local_storage'",
    ),
    (
        "the refusal says why a typo is not read as the default",
        {"target_nodes": "n1", "preserve_local_storage": "true"},
        "would wipe the data drives",
    ),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in HOSTILE], ids=[c[0] for c in HOSTILE])
def test_bad_redeploy_parameters_are_clear_messages(raw: object, expected: str) -> None:
    found = redeploy_parameters(raw)
    assert isinstance(found, BadParameters)
    assert any(expected in problem for problem in found.problems), found.problems
    assert all(len(problem) < 300 for problem in found.problems)


def test_every_bad_parameter_is_reported_at_once() -> None:
    found = redeploy_parameters({"preserve-local-storage": 2, "target-revision": "x", "z": 1})
    assert isinstance(found, BadParameters)
    assert len(found.problems) == 4


REDEPLOY_DESIGN = [
    ("default: last success", history((C, OK), (C,)), Version.SUCCESSFUL_SITE_ACTION, 1),
    ("committed", history((C, OK), (C,), ()), Version.COMMITTED, 2),
    ("last site action even failed", history((C, OK), (C, KO)), Version.LAST_SITE_ACTION, 2),
    ("never deployed: missing", history((C,)), Version.SUCCESSFUL_SITE_ACTION, None),
    ("only failures: missing success", history((C, KO)), Version.SUCCESSFUL_SITE_ACTION, None),
    ("nothing committed: missing", history(()), Version.COMMITTED, None),
]


@pytest.mark.parametrize(
    ("revisions", "wanted", "expected"),
    [c[1:] for c in REDEPLOY_DESIGN],
    ids=[c[0] for c in REDEPLOY_DESIGN],
)
def test_a_target_revision_that_does_not_exist_is_a_missing_precondition(
    revisions: History, wanted: Version, expected: int | None
) -> None:
    found = redeploy_design(revisions, wanted)
    if expected is None:
        assert isinstance(found, MissingPrecondition)
        assert "nothing was touched" in found.message
        assert "target-revision=" in found.message
    else:
        assert found == expected


# --- configdocs status ----------------------------------------------------------------------

ORDER = [
    ("default committed vs buffer", None, (Version.COMMITTED, Version.BUFFER)),
    ("older first whatever the order", ["buffer", "committed"], (Version.COMMITTED, Version.BUFFER)),
    ("comma form", ["last_site_action,successful_site_action"], (Version.SUCCESSFUL_SITE_ACTION, Version.LAST_SITE_ACTION)),
    ("repeated form", ["successful_site_action", "buffer"], (Version.SUCCESSFUL_SITE_ACTION, Version.BUFFER)),
]  # fmt: skip


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in ORDER], ids=[c[0] for c in ORDER])
def test_two_versions_are_put_in_shipyards_order(
    raw: list[str] | None, expected: tuple[Version, Version]
) -> None:
    assert compared_versions(raw) == expected


BAD_VERSIONS = [
    ("one version", ["buffer"], "2 valid versions"),
    ("three versions", ["buffer", "committed", "last_site_action"], "2 valid versions"),
    ("three in a comma string", ["buffer,committed,x"], "2 valid versions"),
    ("the same twice", ["buffer", "buffer"], "must be unique"),
    ("the same in two spellings", ["committed", "Committed"], "must be unique"),
    ("unknown version", ["buffer", "latest"], "is not a valid version"),
    ("huge version", ["buffer", "v" * 100_000], "is not a valid version"),
    ("not a string", ["buffer", 3], "is not a valid version"),
]


@pytest.mark.parametrize(
    ("raw", "expected"), [c[1:] for c in BAD_VERSIONS], ids=[c[0] for c in BAD_VERSIONS]
)
def test_anything_but_two_distinct_valid_versions_is_400(raw: list[object], expected: str) -> None:
    found = compared_versions(raw)
    assert isinstance(found, BadRequest)
    assert expected in found.message
    assert len(found.message) < 300


COMPARE = [
    ("committed to buffer", history((C,), ()), Version.COMMITTED, Version.BUFFER, (1, 2)),
    ("nothing committed: from revision 0", history((), ()), Version.COMMITTED, Version.BUFFER, (0, 2)),
    ("nothing at all: 0 to 0", history(), Version.COMMITTED, Version.BUFFER, (0, 0)),
    ("no buffer: committed with itself", history((C,)), Version.COMMITTED, Version.BUFFER, (1, 1)),
    ("site action to buffer", history((C, OK), (C,), ()), Version.LAST_SITE_ACTION, Version.BUFFER, (1, 3)),
    ("success to committed", history((C, OK), (C, KO), (C,)), Version.SUCCESSFUL_SITE_ACTION, Version.COMMITTED, (1, 3)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("revisions", "base", "new", "expected"),
    [c[1:] for c in COMPARE],
    ids=[c[0] for c in COMPARE],
)
def test_versions_resolve_to_revisions_as_shipyard_does(
    revisions: History, base: Version, new: Version, expected: tuple[int, int]
) -> None:
    assert compare(revisions, base, new) == Comparison(base, expected[0], new, expected[1])


@pytest.mark.parametrize(
    "base", [Version.SUCCESSFUL_SITE_ACTION, Version.LAST_SITE_ACTION], ids=str
)
def test_a_site_action_version_that_does_not_exist_is_404(base: Version) -> None:
    found = compare(history((C,), ()), base, Version.BUFFER)
    assert isinstance(found, NotFound)
    assert f"{base} version does not exist" in found.message


def test_configdocs_status_rows_from_the_stores_diff() -> None:
    def ident(name: str) -> tuple[str, str]:
        return ("metalmend/Host/v1", name)

    older = {"kept": {ident("a"): "d1"}, "changed": {ident("b"): "d2"}, "gone": {ident("c"): "d3"}}
    newer = {"kept": {ident("a"): "d1"}, "changed": {ident("b"): "d9"}, "new": {ident("d"): "d4"}}
    comparison = Comparison(Version.COMMITTED, 2, Version.BUFFER, 3)
    rows = configdocs_status(comparison, bucket_diff(older, newer))
    assert {r["collection_name"]: (r["base_status"], r["new_status"]) for r in rows} == {
        "kept": ("present", "unmodified"),
        "changed": ("present", "modified"),
        "gone": ("present", "deleted"),
        "new": ("not present", "created"),
    }
    assert rows[0] == {
        "collection_name": "changed",
        "base_version": "committed",
        "base_revision": 2,
        "new_version": "buffer",
        "new_revision": 3,
        "base_status": "present",
        "new_status": "modified",
    }


def test_an_unknown_bucket_status_is_a_bug_not_a_row() -> None:
    with pytest.raises(ValueError, match="invalid status"):
        configdocs_status(Comparison(Version.COMMITTED, 1, Version.BUFFER, 2), {"x": "renamed"})


# --- action ids and lifecycle -----------------------------------------------------------------

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


@pytest.mark.parametrize(
    ("now", "entropy", "expected"),
    [
        (EPOCH, bytes(10), "0" * 26),
        (EPOCH, b"\xff" * 10, "0" * 10 + "Z" * 16),
        (EPOCH + dt.timedelta(milliseconds=1), bytes(10), "0" * 9 + "1" + "0" * 16),
        # The ULID spec's example time, 1469918176385 ms: its documented prefix 01ARYZ6S41.
        (
            EPOCH + dt.timedelta(milliseconds=1469918176385),
            bytes(10),
            "01ARYZ6S41" + "0" * 16,
        ),
    ],
    ids=["zero", "all random bits set", "one millisecond", "ulid spec example time"],
)
def test_an_action_id_is_a_ulid(now: dt.datetime, entropy: bytes, expected: str) -> None:
    found = new_action_id(now, entropy)
    assert found == expected
    assert len(found) == 26
    assert is_action_id(found)


def test_action_ids_sort_by_creation_time() -> None:
    first = new_action_id(dt.datetime(2026, 11, 23, 21, 0, tzinfo=dt.UTC), b"\xff" * 10)
    later = new_action_id(dt.datetime(2026, 11, 23, 21, 0, 0, 1000, tzinfo=dt.UTC), bytes(10))
    assert first < later


@pytest.mark.parametrize(
    ("now", "entropy", "message"),
    [
        (dt.datetime(2026, 1, 1), bytes(10), "aware"),
        (EPOCH, bytes(9), "10 random bytes"),
        (EPOCH - dt.timedelta(seconds=1), bytes(10), "outside"),
    ],
    ids=["naive time", "short entropy", "before the epoch"],
)
def test_an_action_id_refuses_what_it_cannot_encode(
    now: dt.datetime, entropy: bytes, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        new_action_id(now, entropy)


@pytest.mark.parametrize(
    "raw",
    ["", "0" * 25, "8" + "0" * 25, "0" * 25 + "U", "0" * 25 + "a", 5, None],
    ids=["empty", "short", "overflowing first char", "U not crockford", "lowercase", "int", "none"],
)
def test_not_an_action_id(raw: object) -> None:
    assert not is_action_id(raw)


def test_the_lifecycle_is_shipyards() -> None:
    assert [str(state) for state in ActionLifecycle] == [
        "Pending",
        "Processing",
        "Complete",
        "Failed",
    ]
