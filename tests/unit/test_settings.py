"""The settings tree (metalmend.settings): one default per field, and the same values from a
file, the environment or flags, in that order of precedence, each checked the same way."""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
from pathlib import Path
from typing import Any

import pytest

from metalmend import settings
from metalmend.settings import (
    DEFAULTS,
    FenceMethod,
    LogLevel,
    RequestRemediationBy,
    Settings,
    SettingsError,
    env_name,
    load,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "metalmend.yaml"
    path.write_text(text)
    return path


def test_every_field_has_a_docstring_or_is_a_section() -> None:
    """Each default is written once, with why: the tree's sections are dataclasses whose
    fields carry their own docstrings (attribute docstrings, read from the source)."""
    import ast
    import inspect

    for section in dataclasses.fields(Settings):
        cls = type(getattr(DEFAULTS, section.name))
        tree = ast.parse(inspect.getsource(cls))
        body = tree.body[0].body  # type: ignore[attr-defined]
        documented = {
            stmt.target.id
            for stmt, after in itertools.pairwise(body)
            if isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        }
        # RetrySettings documents its schedule as a whole, in the class docstring.
        if cls is settings.RetrySettings:
            assert cls.__doc__
            continue
        missing = {f.name for f in dataclasses.fields(cls)} - documented
        assert not missing, f"{cls.__name__}: no docstring for {sorted(missing)}"


def test_environment_variable_names_are_unique() -> None:
    names = [env_name(section, name) for section, name in settings.paths()]
    assert len(names) == len(set(names))
    assert env_name("power", "soft_timeout") == "METALMEND_POWER_SOFT_TIMEOUT"


def test_nothing_set_gives_the_defaults() -> None:
    assert load(None, {}, {}) == Settings() == DEFAULTS


def test_a_file_sets_any_section(tmp_path: Path) -> None:
    file = write(
        tmp_path,
        """
runtime:
  namespace: tenant-a
  secret_namespaces: [bmc-a, bmc-b]
  controllers: [host-power, node-link]
  log_level: debug
bmc:
  timeout: 12
  allowed_networks: [10.20.0.0/16, "fd00::/64"]
power:
  soft_timeout: 0
  command_retry: 45
power_retry:
  cap: 120
health_checks:
  request_remediation_by: annotation
remediation:
  fence: out-of-service-taint
  retry_base: 60
""",
    )
    loaded = load(file, {}, {})
    assert loaded.runtime.namespace == "tenant-a"
    assert loaded.runtime.secret_namespaces == ("bmc-a", "bmc-b")
    assert loaded.runtime.controller_names == ["host-power", "node-link"]
    assert loaded.runtime.log_level is LogLevel.DEBUG
    assert loaded.bmc.timeout == 12.0
    assert loaded.bmc.allowed_networks == (
        ipaddress.ip_network("10.20.0.0/16"),
        ipaddress.ip_network("fd00::/64"),
    )
    assert loaded.power.soft_timeout == 0.0
    assert loaded.power.command_retry == 45.0
    assert loaded.power.poll_interval == DEFAULTS.power.poll_interval
    assert loaded.power_retry.cap == 120.0
    assert loaded.health_checks.request_remediation_by is RequestRemediationBy.ANNOTATION
    assert loaded.remediation.fence is FenceMethod.OUT_OF_SERVICE_TAINT
    assert loaded.remediation.retry_base == 60.0


def test_the_environment_sets_fields_with_strings() -> None:
    loaded = load(
        None,
        {
            "METALMEND_RUNTIME_NAMESPACE": "tenant-a",
            "METALMEND_RUNTIME_SECRET_NAMESPACES": "bmc-a, bmc-b,",
            "METALMEND_RUNTIME_LEADER_ELECT": "true",
            "METALMEND_BMC_ALLOW_INSECURE_HTTP": "yes",
            "METALMEND_BMC_MAX_IN_FLIGHT": "32",
            "METALMEND_BMC_CA_BUNDLE": "",
            "METALMEND_POWER_SOFT_TIMEOUT": "240",
            "METALMEND_REMEDIATION_FENCE": "out-of-service-taint",
            "METALMEND_LAB_DIR": "/elsewhere",  # another command's variable: not a setting
        },
        {},
    )
    assert loaded.runtime.namespace == "tenant-a"
    assert loaded.runtime.secret_namespaces == ("bmc-a", "bmc-b")
    assert loaded.runtime.leader_elect is True
    assert loaded.bmc.allow_insecure_http is True
    assert loaded.bmc.max_in_flight == 32
    assert loaded.bmc.ca_bundle is None
    assert loaded.power.soft_timeout == 240.0
    assert loaded.remediation.fence is FenceMethod.OUT_OF_SERVICE_TAINT


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path: Path) -> None:
    file = write(tmp_path, "power: {soft_timeout: 100, poll_interval: 10, command_retry: 40}\n")
    environ = {"METALMEND_POWER_SOFT_TIMEOUT": "200", "METALMEND_POWER_POLL_INTERVAL": "5"}
    flags = {("power", "soft_timeout"): ("--soft-power-off-timeout", 300.0)}
    loaded = load(file, environ, flags)
    assert loaded.power.soft_timeout == 300.0  # flag
    assert loaded.power.poll_interval == 5.0  # environment over file
    assert loaded.power.command_retry == 40.0  # file over default
    assert loaded.power.transition_poll == DEFAULTS.power.transition_poll  # default


@pytest.mark.parametrize(
    ("text", "environ", "says"),
    [
        ("power: {poll_interval: 0}\n", {}, "{file}: power.poll_interval must be a positive number of seconds, not 0"),
        ("power: {soft_timeout: -1}\n", {}, "{file}: power.soft_timeout must be a non-negative number of seconds, not -1"),
        ("power: {poll_budget: -5}\n", {}, "{file}: power.poll_budget must be a non-negative number, not -5"),
        ("bmc: {timeout: soon}\n", {}, "{file}: bmc.timeout must be a positive number of seconds, not 'soon'"),
        ("bmc: {max_in_flight: 2.5}\n", {}, "{file}: bmc.max_in_flight must be a positive whole number, not 2.5"),
        ("bmc: {allowed_networks: [10.0.0.0/99]}\n", {}, "{file}: bmc.allowed_networks must be a CIDR such as 10.20.0.0/16, not '10.0.0.0/99'"),
        ("remediation: {fence: reboot}\n", {}, "{file}: remediation.fence must be one of delete-node, out-of-service-taint, not 'reboot'"),
        ("runtime: {leader_elect: maybe}\n", {}, "{file}: runtime.leader_elect must be true or false, not 'maybe'"),
        ("runtime: {health_bind: '8081'}\n", {}, "{file}: runtime.health_bind must be host:port, not '8081'"),
        ("runtime: {controllers: [host-power, nonsense]}\n", {}, "unknown controller(s): nonsense"),
        ("power: {soft_timout: 10}\n", {}, "{file}: unknown setting power.soft_timout (known: command_retry,"),
        ("powr: {soft_timeout: 10}\n", {}, "{file}: unknown section 'powr' (known: bmc, destroy, health_checks,"),
        ("- power\n", {}, "settings file {file} must be a mapping of sections"),
        ("power: [1, 2]\n", {}, "{file}: power must be a mapping of settings"),
        ("power: {soft_timeout: 1\n", {}, "settings file {file} is not YAML at line 2"),
        ("", {"METALMEND_POWER_POLL_INTERVAL": "nan"}, "METALMEND_POWER_POLL_INTERVAL must be a positive number of seconds, not nan"),
        ("", {"METALMEND_BMC_TIMEOUT": "inf"}, "METALMEND_BMC_TIMEOUT must be a positive number of seconds, not inf"),
        ("", {"METALMEND_POWER_RETRY_JITTER": "-0.5"}, "METALMEND_POWER_RETRY_JITTER must be a non-negative number, not -0.5"),
        ("", {"METALMEND_RUNTIME_LOG_LEVEL": "loud"}, "METALMEND_RUNTIME_LOG_LEVEL must be one of debug, info, warning, error, not 'loud'"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_where_it_came_from(
    tmp_path: Path, text: str, environ: dict[str, str], says: str
) -> None:
    file = write(tmp_path, text)
    with pytest.raises(SettingsError) as raised:
        load(file, environ, {})
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(says.format(file=file)), message


def test_a_missing_file_is_a_settings_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=r"cannot read settings file .*: No such file"):
        load(tmp_path / "absent.yaml", {}, {})


def test_an_empty_file_or_section_changes_nothing(tmp_path: Path) -> None:
    assert load(write(tmp_path, "power:\n"), {}, {}) == DEFAULTS
    assert load(write(tmp_path, "# nothing yet\n"), {}, {}) == DEFAULTS


def test_all_controllers_is_the_registry_in_order() -> None:
    from metalmend.controllers import registry

    assert DEFAULTS.runtime.controller_names == list(registry.CONTROLLERS)
    none: Any = load(None, {"METALMEND_RUNTIME_CONTROLLERS": ""}, {})
    assert none.runtime.controller_names == []
