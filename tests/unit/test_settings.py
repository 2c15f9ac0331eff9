"""The settings tree (metalmend.settings): one default per field, and the same values from a
file, the environment or flags, in that order of precedence, each checked the same way."""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import re
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
        ("power: {poll_interval: 0}\n", {}, "{file}: power.poll_interval must be a number of seconds from 0.1 to 3600, not 0"),
        ("power: {soft_timeout: -1}\n", {}, "{file}: power.soft_timeout must be a number of seconds from 0 to 86400, not -1"),
        ("power: {poll_budget: -5}\n", {}, "{file}: power.poll_budget must be 0 (no limit) or a number of BMC reads a second from 1 to 100000, not -5"),
        ("bmc: {timeout: soon}\n", {}, "{file}: bmc.timeout must be a number of seconds from 0.1 to 3600, not 'soon'"),
        ("bmc: {max_in_flight: 2.5}\n", {}, "{file}: bmc.max_in_flight must be a whole number from 1 to 10000, not 2.5"),
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
        ("", {"METALMEND_POWER_POLL_INTERVAL": "nan"}, "METALMEND_POWER_POLL_INTERVAL must be a number of seconds from 0.1 to 3600, not nan"),
        ("", {"METALMEND_BMC_TIMEOUT": "inf"}, "METALMEND_BMC_TIMEOUT must be a number of seconds from 0.1 to 3600, not inf"),
        ("", {"METALMEND_POWER_RETRY_JITTER": "-0.5"}, "METALMEND_POWER_RETRY_JITTER must be a number from 0 to 1, not -0.5"),
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


# ---- every numeric setting has a range, checked at start (issue 36) --------------------


def numeric_paths() -> list[tuple[str, str]]:
    """Every (section, field) of the tree whose type is int or float (alone or optional)."""
    import typing

    found = []
    for section in dataclasses.fields(Settings):
        hints = typing.get_type_hints(type(getattr(DEFAULTS, section.name)))
        for name, kind in hints.items():
            kinds = set(typing.get_args(kind)) or {kind}
            if kinds & {int, float}:
                found.append((section.name, name))
    return found


def test_every_numeric_setting_has_a_range_and_only_those() -> None:
    assert sorted(settings.RANGES) == sorted(numeric_paths())


@pytest.mark.parametrize("path", sorted(settings.RANGES), ids=".".join)
def test_every_default_lies_in_its_range(path: tuple[str, str]) -> None:
    section, name = path
    assert settings.RANGES[path].allows(getattr(getattr(DEFAULTS, section), name))


def kind_of(path: tuple[str, str]) -> type:
    return type(getattr(getattr(DEFAULTS, path[0]), path[1]))


def outside(path: tuple[str, str]) -> list[str]:
    """Values (as typed in the environment) just outside the range of ``path``, and ones no
    range allows: each must be refused."""
    allowed, kind = settings.RANGES[path], kind_of(path)
    step = allowed.low / 2 if kind is float and allowed.low > 0 else 1
    candidates = [allowed.low - step, allowed.high + 1, allowed.high * 2, -1, 1e300, -1e300]
    typed = [repr(kind(v)) for v in candidates] + ["1e-300", "nan", "inf", "-inf", "many"]

    def refused(text: str) -> bool:
        try:
            return not allowed.allows(kind(text))
        except ValueError:
            return True

    return [t for t in typed if refused(t)]


@pytest.mark.parametrize("path", sorted(settings.RANGES), ids=".".join)
def test_each_numeric_setting_takes_both_ends_of_its_range(path: tuple[str, str]) -> None:
    section, name = path
    allowed = settings.RANGES[path]
    kind = kind_of(path)
    ends = [allowed.low, allowed.high] + ([0] if allowed.zero else [])
    for end in ends:
        loaded = load(None, {env_name(section, name): repr(kind(end))}, {})
        assert getattr(getattr(loaded, section), name) == end


@pytest.mark.parametrize("path", sorted(settings.RANGES), ids=".".join)
def test_a_number_outside_its_range_is_one_line_naming_the_setting_and_the_range(
    path: tuple[str, str], tmp_path: Path
) -> None:
    section, name = path
    allowed = settings.RANGES[path]
    described = allowed.describe(kind_of(path))
    assert len(outside(path)) >= 6
    for value in outside(path):
        variable = env_name(section, name)
        with pytest.raises(SettingsError) as raised:
            load(None, {variable: value}, {})
        message = str(raised.value)
        assert "\n" not in message
        assert message.startswith(f"{variable} must be {described}, not "), message
        # ... and the same from the file, naming section.field
        file = write(tmp_path, f"{section}: {{{name}: {value}}}\n")
        with pytest.raises(SettingsError) as raised:
            load(file, {}, {})
        assert str(raised.value).startswith(f"{file}: {section}.{name} must be {described}"), (
            raised.value
        )


@pytest.mark.parametrize(
    ("path", "says"),
    [
        (("power", "poll_budget"), "0 (no limit) or a number of BMC reads a second from 1 to 100000"),
        (("power", "poll_interval"), "a number of seconds from 0.1 to 3600"),
        (("power", "soft_timeout"), "a number of seconds from 0 to 86400"),
        (("power_retry", "jitter"), "a number from 0 to 1"),
        (("bmc", "max_in_flight"), "a whole number from 1 to 10000"),
        (("serve", "port"), "a whole number from 1 to 65535"),
        (("serve", "max_body_bytes"), "a whole number of bytes from 65536 to 1073741824"),
    ],
)  # fmt: skip
def test_ranges_read_plainly(path: tuple[str, str], says: str) -> None:
    assert settings.RANGES[path].describe(kind_of(path)) == says


def test_the_probes_poll_budget_is_refused() -> None:
    """Issue 36: --power-poll-budget 1e-300 broke every host-power reconcile; 0.001 made a
    host read every 3,000 s."""
    for value in ("1e-300", "0.001", "0.5"):
        with pytest.raises(
            SettingsError, match=re.escape("power.poll_budget must be 0 (no limit) or")
        ):
            load(None, {}, {("power", "poll_budget"): ("power.poll_budget", float(value))})
    assert load(None, {"METALMEND_POWER_POLL_BUDGET": "0"}, {}).power.poll_budget == 0


@pytest.mark.parametrize("bind", ["127.0.0.1:65536", "127.0.0.1:99999999999999999999"])
def test_the_health_port_is_in_range(bind: str) -> None:
    with pytest.raises(SettingsError, match="with a port from 0 to 65535"):
        load(None, {"METALMEND_RUNTIME_HEALTH_BIND": bind}, {})
    assert load(None, {"METALMEND_RUNTIME_HEALTH_BIND": "127.0.0.1:0"}, {}).runtime.health_bind
