"""The impersonation headers serve sends when it writes a design as its caller
(kube.impersonate), and the stored identity read back: tables, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from metalmend.kube.impersonate import Who, headers


@pytest.mark.parametrize(
    ("who", "expected"),
    [
        (Who("alice"), [("Impersonate-User", "alice")]),
        (
            Who("system:serviceaccount:ops:deployer", "u-1",
                ("system:serviceaccounts", "system:authenticated"),
                {"authentication.kubernetes.io/credential-id": ("JTI=abc",)}),
            [("Impersonate-User", "system:serviceaccount:ops:deployer"),
             ("Impersonate-Uid", "u-1"),
             ("Impersonate-Group", "system:serviceaccounts"),
             ("Impersonate-Group", "system:authenticated"),
             ("Impersonate-Extra-authentication.kubernetes.io%2Fcredential-id", "JTI=abc")],
        ),
        (Who("bob", extra={"scopes": ("a", "b")}),
         [("Impersonate-User", "bob"), ("Impersonate-Extra-scopes", "a"),
          ("Impersonate-Extra-scopes", "b")]),
    ],
)  # fmt: skip
def test_the_headers_name_the_user_its_groups_and_extras(
    who: Who, expected: list[tuple[str, str]]
) -> None:
    assert headers(who) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),  # an action stored before identities were kept
        ({}, None),
        ({"username": ""}, None),
        ({"username": 7}, None),
        ({"username": "a", "groups": "g"}, None),
        ({"username": "a"}, Who("a")),
        ({"username": "a", "uid": "1", "groups": ["g"], "extra": {"k": ["v"]}},
         Who("a", "1", ("g",), {"k": ("v",)})),
    ],
)  # fmt: skip
def test_a_stored_identity_reads_back_or_is_none(raw: Any, expected: Who | None) -> None:
    assert Who.from_wire(raw) == expected
    if expected is not None:
        assert Who.from_wire(expected.to_wire()) == expected
