"""Credentials come from the host's own Secret: trimmed, complete, never shown."""

from __future__ import annotations

import base64

import pytest

from metalmend.bmc import CredentialsError
from metalmend.bmc.credentials import from_secret_data


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def test_surrounding_whitespace_is_trimmed() -> None:
    creds = from_secret_data({"username": b64(" admin\n"), "password": b64("s3cret \n")}, "ns/s")
    assert (creds.username, creds.password) == ("admin", "s3cret")


def test_the_password_is_not_in_the_repr() -> None:
    creds = from_secret_data({"username": b64("admin"), "password": b64("s3cret")}, "ns/s")
    assert "s3cret" not in repr(creds)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        pytest.param({"username": b64("admin")}, "no 'password' key", id="missing password"),
        pytest.param(None, "no 'username' key", id="no data"),
        pytest.param(
            {"username": b64("admin"), "password": b64("  ")}, "'password' is empty", id="blank"
        ),
        pytest.param(
            {"username": "%%%", "password": b64("x")}, "not valid base64", id="not base64"
        ),
    ],
)
def test_incomplete_secrets_say_what_is_missing(data: dict[str, str] | None, says: str) -> None:
    with pytest.raises(CredentialsError, match=says):
        from_secret_data(data, "ns/s")
