"""`metalmend run` refuses waits that make no sense before it touches any cluster."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from metalmend.cli import app

# A kubeconfig that does not exist: a flag accepted by mistake would get as far as
# loading it and fail differently (code 2 with another message), so the assertions below
# would catch that too.
NO_CLUSTER = ["--kubeconfig", "/nonexistent/kubeconfig"]


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--power-poll-interval", "-1", "--power-poll-interval must be a positive number of seconds, not -1"),
        ("--power-poll-interval", "0", "--power-poll-interval must be a positive number of seconds, not 0"),
        ("--power-poll-interval", "nan", "--power-poll-interval must be a positive number of seconds, not nan"),
        ("--bmc-timeout", "0", "--bmc-timeout must be a positive number of seconds, not 0"),
        ("--bmc-timeout", "-5", "--bmc-timeout must be a positive number of seconds, not -5"),
        ("--bmc-timeout", "inf", "--bmc-timeout must be a positive number of seconds, not inf"),
        ("--soft-power-off-timeout", "-1", "--soft-power-off-timeout must be a non-negative number of seconds, not -1"),
    ],
)  # fmt: skip
def test_non_positive_waits_are_a_clear_cli_error(flag: str, value: str, says: str) -> None:
    result = CliRunner().invoke(app, ["run", *NO_CLUSTER, flag, value])
    assert result.exit_code == 2, result.output
    assert says in " ".join(result.output.split())
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output


def test_a_positive_wait_gets_past_flag_checks() -> None:
    """The same invocation with sane values fails later, on the missing kubeconfig: the
    checks above refuse only what they should."""
    result = CliRunner().invoke(
        app, ["run", *NO_CLUSTER, "--bmc-timeout", "0.5", "--power-poll-interval", "2"]
    )
    assert "must be a positive number" not in result.output
