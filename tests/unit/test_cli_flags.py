"""`metalmend run` refuses waits that make no sense before it touches any cluster, and
builds its settings from flags, environment and file (metalmend.settings)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from metalmend import log, runner
from metalmend.cli.main import app
from metalmend.settings import (
    DEFAULTS,
    FenceMethod,
    LogLevel,
    RequestRemediationBy,
    Settings,
)

# A kubeconfig that does not exist: a flag accepted by mistake would get as far as
# loading it and fail differently (code 2 with another message), so the assertions below
# would catch that too.
NO_CLUSTER = ["--kubeconfig", "/nonexistent/kubeconfig"]


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--power-poll-interval", "-1", "--power-poll-interval must be a number of seconds from 0.1 to 3600, not -1"),
        ("--power-poll-interval", "0", "--power-poll-interval must be a number of seconds from 0.1 to 3600, not 0"),
        ("--power-poll-interval", "nan", "--power-poll-interval must be a number of seconds from 0.1 to 3600, not nan"),
        ("--bmc-timeout", "0", "--bmc-timeout must be a number of seconds from 0.1 to 3600, not 0"),
        ("--bmc-timeout", "-5", "--bmc-timeout must be a number of seconds from 0.1 to 3600, not -5"),
        ("--bmc-timeout", "inf", "--bmc-timeout must be a number of seconds from 0.1 to 3600, not inf"),
        ("--soft-power-off-timeout", "-1", "--soft-power-off-timeout must be a number of seconds from 0 to 86400, not -1"),
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
    assert " must be " not in result.output


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """What `metalmend run` would start with, instead of starting it."""
    seen: list[Settings] = []

    async def run(config: runner.RunConfig) -> None:
        seen.append(config.settings)

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(log, "setup", lambda level: None)
    return seen


def test_no_flags_runs_with_the_settings_trees_defaults(started: list[Settings]) -> None:
    result = CliRunner().invoke(app, ["run"], env={})
    assert result.exit_code == 0, result.output
    assert started == [DEFAULTS]


def test_flags_set_their_fields_with_enums_for_choices(started: list[Settings]) -> None:
    result = CliRunner().invoke(
        app,
        ["run", "--fence", "out-of-service-taint", "--request-remediation-by", "annotation",
         "--log-level", "DEBUG", "--secret-namespaces", "a,b", "--bmc-allowed-network",
         "10.0.0.0/8", "--bmc-allowed-network", "192.168.1.7/24", "--controllers", "host-power",
         "--bmc-ca-bundle", "/etc/ca.pem"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert settings.remediation.fence is FenceMethod.OUT_OF_SERVICE_TAINT
    assert settings.health_checks.request_remediation_by is RequestRemediationBy.ANNOTATION
    assert settings.runtime.log_level is LogLevel.DEBUG
    assert settings.runtime.secret_namespaces == ("a", "b")
    assert [str(n) for n in settings.bmc.allowed_networks] == ["10.0.0.0/8", "192.168.1.0/24"]
    assert settings.runtime.controller_names == ["host-power"]
    assert settings.bmc.ca_bundle == "/etc/ca.pem"


def test_a_flag_beats_the_environment_which_beats_the_file(
    started: list[Settings], tmp_path: Path
) -> None:
    config = tmp_path / "metalmend.yaml"
    config.write_text("power: {soft_timeout: 100, poll_interval: 10, command_retry: 40}\n")
    result = CliRunner().invoke(
        app,
        ["run", "--config", str(config), "--soft-power-off-timeout", "300"],
        env={"METALMEND_POWER_SOFT_TIMEOUT": "200", "METALMEND_POWER_POLL_INTERVAL": "5"},
    )
    assert result.exit_code == 0, result.output
    (settings,) = started
    assert (settings.power.soft_timeout, settings.power.poll_interval) == (300.0, 5.0)
    assert settings.power.command_retry == 40.0


def test_a_flag_left_at_its_default_does_not_hide_the_environment(
    started: list[Settings],
) -> None:
    result = CliRunner().invoke(
        app, ["run"], env={"METALMEND_REMEDIATION_FENCE": "out-of-service-taint"}
    )
    assert result.exit_code == 0, result.output
    assert started[0].remediation.fence is FenceMethod.OUT_OF_SERVICE_TAINT


@pytest.mark.parametrize(
    ("args", "env", "file", "says"),
    [
        ([], {"METALMEND_POWER_POLL_INTERVAL": "0"}, None, "METALMEND_POWER_POLL_INTERVAL must be a number of seconds from 0.1 to 3600, not 0"),
        ([], {"METALMEND_REMEDIATION_FENCE": "reboot"}, None, "METALMEND_REMEDIATION_FENCE must be one of delete-node, out-of-service-taint, not 'reboot'"),
        ([], {}, "bmc: {timeout: -3}\n", "{file}: bmc.timeout must be a number of seconds from 0.1 to 3600, not -3"),
        ([], {}, "runtime: {health_bind: nowhere}\n", "{file}: runtime.health_bind must be host:port, not 'nowhere'"),
        (["--health-bind", "8081"], {}, None, "--health-bind must be host:port, not '8081'"),
        (["--bmc-allowed-network", "10.0.0.0/99"], {}, None, "--bmc-allowed-network must be a CIDR such as 10.20.0.0/16, not '10.0.0.0/99'"),
        (["--remediation-retry-base", "0"], {}, None, "--remediation-retry-base must be a number of seconds from 0.1 to 86400, not 0"),
        (["--controllers", "nonsense"], {}, None, "unknown controller(s): nonsense"),
    ],
)  # fmt: skip
def test_a_bad_setting_from_anywhere_is_one_line_and_exit_2(
    started: list[Settings],
    tmp_path: Path,
    args: list[str],
    env: dict[str, str],
    file: str | None,
    says: str,
) -> None:
    config = tmp_path / "metalmend.yaml"
    if file is not None:
        config.write_text(file)
        args = [*args, "--config", str(config)]
    result = CliRunner().invoke(app, ["run", *args], env=env)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert " ".join(lines[0].split()).startswith(f"metalmend: {says.format(file=config)}")
    assert started == []


@pytest.mark.parametrize("flag", ["--fence", "--request-remediation-by", "--log-level"])
def test_a_choice_outside_its_enum_is_refused_by_the_parser(
    started: list[Settings], flag: str
) -> None:
    result = CliRunner().invoke(app, ["run", flag, "bogus"])
    assert result.exit_code == 2
    assert "Invalid value" in result.output
    assert started == []
