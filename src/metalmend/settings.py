"""Every setting of ``metalmend run``, as one tree of frozen dataclasses, one per concern.

``Settings`` groups the sections; each field's default is written once, in its section,
with a docstring saying why it is what it is. The sections that a policy reads are
defined next to that policy (``metalmend.policy`` may import nothing outside
``metalmend.api`` and itself, so it cannot import this module) and composed here:

- ``runtime``: what runs, where, and how it reports (this module);
- ``bmc``: ``metalmend.bmc.settings.BmcSettings``, the BMC layer's deadlines and limits;
- ``power``: ``metalmend.policy.hostpower.PowerSettings``, the host-power timers;
- ``power_retry``: ``metalmend.policy.hostpower.RetrySettings``, when a host whose BMC
  failed is tried again;
- ``health_checks``: the MachineHealthCheck controller (this module);
- ``remediation``: ``metalmend.policy.remediation.Settings`` (fencing, retries).

The same values come from four places, the first that sets a field winning: a command-line
flag of ``metalmend run``, an environment variable ``METALMEND_<SECTION>_<FIELD>``
(``METALMEND_POWER_SOFT_TIMEOUT=240``; lists comma-separated, an empty value for "none"),
a YAML file given with ``--config`` (``power: {soft_timeout: 240}``), and the defaults
below. Every value is checked the same way whichever place it came from; a bad one is one
line naming that place (``SettingsError``). The Helm chart renders the file from its
values into a ConfigMap and may set single fields by environment.

``metalmend serve`` reads ``serve`` (``metalmend.web.settings.ServeSettings``: bind
address, port, TLS) and ``teardown`` (``metalmend.teardown.policy.settings.TeardownSettings``: the
node-teardown steps' retries) and ``destroy`` (``metalmend.destroy.policy.destroy.DestroySettings``:
Drydock's destroy_nodes, docs/destroy.md) and ``redeploy``
(``metalmend.siteactions.policy.redeploy.RedeploySettings``: redeploy_server's waits,
docs/site-actions.md), besides ``runtime.kubeconfig``.

A new section joins the tree the same way, a frozen dataclass with a documented default
per field, added to ``Settings`` with a default instance (so a file or environment written
before it keeps loading). A section that a policy reads is defined next to that policy, as
``power`` is (docs/architecture.md maps each section to its package).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import re
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from pathlib import Path
from typing import Any

import yaml

from metalmend.bmc.settings import BmcSettings
from metalmend.destroy.policy.destroy import DestroySettings
from metalmend.policy import healthcheck as healthcheck_policy
from metalmend.policy.hostpower import PowerSettings, RetrySettings
from metalmend.policy.remediation import FenceMethod
from metalmend.policy.remediation import Settings as RemediationSettings
from metalmend.siteactions.policy.redeploy import RedeploySettings
from metalmend.teardown.policy.settings import TeardownSettings
from metalmend.web.settings import ServeSettings

ENV_PREFIX = "METALMEND_"
# A replica's name in the shard ring: a label value and part of its Lease's name.
SHARD_ID = re.compile(r"[a-z0-9]([a-z0-9-]{0,48}[a-z0-9])?")
ALL_CONTROLLERS = "all"
# Every controller ``metalmend run`` can start, in the order ``all`` starts them; the
# registry (metalmend.controllers.registry) maps each name to its setup, and a test holds
# the two equal. Named here so that the settings need not import the controllers, which
# import the settings.
CONTROLLER_NAMES = (
    "node-link",
    "host-power",
    "machine-health-check",
    "node-health-check",
    "metal3-remediation",
    "machine-remediation",
    "fence-remediation",
)


class LogLevel(StrEnum):
    DEBUG = "debug"
    INFO = "info"
    WARNING = "warning"
    ERROR = "error"


class RequestRemediationBy(StrEnum):
    """How a MachineHealthCheck without a remediationTemplate asks for remediation."""

    CONDITIONS = "conditions"
    """Cluster API's way: HealthCheckSucceeded=False and OwnerRemediated=False on the
    Machine, for its owner (a MachineSet) to replace it."""

    ANNOTATION = "annotation"
    """metal3's annotation-based remediation design: ``host.metal3.io/external-remediation``
    on the Machine, acted on by the machine-remediation controller."""


@dataclass(frozen=True)
class RuntimeSettings:
    """What ``metalmend run`` runs, on which objects, and where it reports."""

    kubeconfig: Path | None = None
    """Kubeconfig to use; None: in-cluster, then ``$KUBECONFIG``, then ``~/.kube/config``
    (lightkube's order), so that the same command works in a Pod and on a laptop."""

    controllers: tuple[str, ...] = (ALL_CONTROLLERS,)
    """Controllers to run, by name (``metalmend.controllers.registry``); ``all`` for every
    one: a single deployment is the usual case."""

    namespace: str | None = None
    """Watch only this namespace; None: all namespaces (one metalmend per cluster)."""

    secret_namespaces: tuple[str, ...] = ()
    """Without ``namespace``: the namespaces whose (labelled) BMC Secrets host-power may
    read, one RoleBinding each. Empty: all namespaces, which needs a cluster-wide
    list/watch of Secrets; naming them lets the RBAC stay narrow."""

    health_bind: str = "127.0.0.1:8081"
    """host:port for /healthz, /readyz and /metrics. Loopback by default: nothing is
    exposed until the operator chooses to (the Helm chart binds the Pod's address)."""

    leader_elect: bool = False
    """Run the controllers only while holding the leader Lease. Off by default because a
    single replica needs no Lease; on for more than one replica (two would fight)."""

    leader_election_namespace: str | None = None
    """Namespace of the Lease; None: the Pod's own namespace, or ``default`` outside a Pod."""

    log_level: LogLevel = LogLevel.INFO
    """info: one line per action taken on a host, nothing per idle reconcile."""

    shard: bool = False
    """Share the hosts between every replica run with it (docs/sharding.md): each replica
    holds a Lease of its own, the leader assigns each BareMetalHost to one live replica (a
    label) and host-power acts only on its own. Needs ``leader_elect``. Off: one replica
    (the leader) does everything, as before."""

    shard_id: str | None = None
    """This replica's name in the ring (a label value); None: the host name, which in a
    Pod is the Pod's name (the chart's StatefulSet keeps it across restarts, so a replica
    restarted gets its hosts back)."""

    @property
    def controller_names(self) -> list[str]:
        """``controllers`` with ``all`` spelt out, in the registry's order."""
        if ALL_CONTROLLERS in self.controllers:
            return list(CONTROLLER_NAMES)
        return list(self.controllers)


@dataclass(frozen=True)
class HealthCheckSettings:
    """The MachineHealthCheck controller."""

    request_remediation_by: RequestRemediationBy = RequestRemediationBy.CONDITIONS
    """For a check without a remediationTemplate that does not say itself (annotation
    ``metalmend.dev/request-remediation-by``): Cluster API's own way by default, which
    every Cluster API setup understands."""

    template_retry: float = healthcheck_policy.Settings.template_retry  # one default, the policy's
    """Seconds before looking again for a remediationTemplate that does not exist: a
    template is usually created moments after the check that names it (one ``kubectl
    apply``), and template changes are not watched."""


@dataclass(frozen=True)
class Settings:
    """The whole tree. Sections are keyed by these field names in the file and in the
    environment variable names."""

    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    bmc: BmcSettings = field(default_factory=BmcSettings)
    power: PowerSettings = field(default_factory=PowerSettings)
    power_retry: RetrySettings = field(default_factory=RetrySettings)
    health_checks: HealthCheckSettings = field(default_factory=HealthCheckSettings)
    remediation: RemediationSettings = field(default_factory=RemediationSettings)
    serve: ServeSettings = field(default_factory=ServeSettings)
    teardown: TeardownSettings = field(default_factory=TeardownSettings)
    destroy: DestroySettings = field(default_factory=DestroySettings)
    redeploy: RedeploySettings = field(default_factory=RedeploySettings)


DEFAULTS = Settings()

# Numbers are durations, counts or factors: each must be finite and positive (zero would
# spin a loop or time out at once), except these, where zero has a meaning.
MAY_BE_ZERO = frozenset(
    {
        ("power", "soft_timeout"),  # hard power-off at once
        ("power", "first_poll"),  # read the BMC again right after a command
        ("power", "poll_budget"),  # no limit on routine reads a second
        ("power_retry", "jitter"),  # no jitter
    }
)
# ... and floats are seconds, except these.
NOT_SECONDS = frozenset(
    {
        ("power_retry", "jitter"),
        ("power_retry", "authentication_factor"),
        ("power", "poll_budget"),  # reads a second
    }
)


class SettingsError(ValueError):
    """A value that cannot be used; the message names where it came from."""


Path_ = tuple[str, str]  # (section, field)


def env_name(section: str, name: str) -> str:
    return f"{ENV_PREFIX}{section}_{name}".upper()


def paths() -> list[Path_]:
    """Every (section, field) of the tree."""
    return [
        (section.name, f.name)
        for section in dataclasses.fields(Settings)
        for f in dataclasses.fields(getattr(DEFAULTS, section.name))
    ]


def load(
    file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[Path_, tuple[str, Any]] | None = None,
) -> Settings:
    """The settings from the defaults, then ``file``, then ``environ``, then ``flags``
    ((section, field) -> (flag as typed, its value)), each overriding the one before.
    Raises SettingsError for anything that cannot be used."""
    raw: dict[Path_, tuple[str, Any]] = {}
    if file is not None:
        raw.update(_read_file(file))
    for section, name in paths():
        variable = env_name(section, name)
        if environ is not None and variable in environ:
            raw[(section, name)] = (variable, environ[variable])
    raw.update(flags or {})
    sections: dict[str, Any] = {}
    for part in dataclasses.fields(Settings):
        default = getattr(DEFAULTS, part.name)
        hints = typing.get_type_hints(type(default))
        changes = {
            name: _convert(hints[name], value, source, (part.name, name))
            for (where, name), (source, value) in raw.items()
            if where == part.name
        }
        sections[part.name] = dataclasses.replace(default, **changes)
    settings = Settings(**sections)
    _check_runtime(settings.runtime, raw)
    return settings


def _read_file(file: Path) -> dict[Path_, tuple[str, Any]]:
    try:
        document = yaml.safe_load(file.read_text())
    except OSError as error:
        raise SettingsError(f"cannot read settings file {file}: {error.strerror}") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise SettingsError(f"settings file {file} is not YAML{where}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise SettingsError(f"settings file {file} must be a mapping of sections")
    known = {f.name for f in dataclasses.fields(Settings)}
    found: dict[Path_, tuple[str, Any]] = {}
    for section, values in document.items():
        if section not in known:
            choices = ", ".join(sorted(known))
            raise SettingsError(f"{file}: unknown section {section!r} (known: {choices})")
        if values is None:
            continue
        if not isinstance(values, dict):
            raise SettingsError(f"{file}: {section} must be a mapping of settings")
        fields = {f.name for f in dataclasses.fields(getattr(DEFAULTS, section))}
        for name, value in values.items():
            if name not in fields:
                choices = ", ".join(sorted(fields))
                raise SettingsError(f"{file}: unknown setting {section}.{name} (known: {choices})")
            found[(section, name)] = (f"{file}: {section}.{name}", value)
    return found


def _convert(kind: Any, value: Any, source: str, path: Path_) -> Any:
    """``value`` (from YAML, an environment string or a parsed flag) as ``kind``."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType) and type(None) in args:
        if value is None or value == "":
            return None
        (kind,) = (a for a in args if a is not type(None))
        args = typing.get_args(kind)
    if typing.get_origin(kind) is tuple:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            raise SettingsError(f"{source} must be a list, not {value!r}")
        items = [i.strip() if isinstance(i, str) else i for i in items]
        return tuple(_convert(args[0], i, source, path) for i in items if i != "")
    if kind == ipaddress.IPv4Network | ipaddress.IPv6Network:
        try:
            return ipaddress.ip_network(str(value).strip(), strict=False)
        except ValueError:
            raise SettingsError(
                f"{source} must be a CIDR such as 10.20.0.0/16, not {value!r}"
            ) from None
    if isinstance(kind, type) and issubclass(kind, Enum):
        try:
            return kind(str(value).lower())
        except ValueError:
            choices = ", ".join(str(m.value) for m in kind)
            raise SettingsError(f"{source} must be one of {choices}, not {value!r}") from None
    if kind is bool:
        return _boolean(value, source)
    if kind is float or kind is int:
        return _number(kind, value, source, path)
    if kind is Path:
        return Path(str(value))
    if kind is str:
        if isinstance(value, Path):  # a path flag (--bmc-ca-bundle) kept as text
            return str(value)
        if not isinstance(value, str):
            raise SettingsError(f"{source} must be a string, not {value!r}")
        return value
    raise TypeError(f"no conversion to {kind!r} for {source}")  # a new field's type


def _boolean(value: Any, source: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise SettingsError(f"{source} must be true or false, not {value!r}")


def _number(kind: type[float] | type[int], value: Any, source: str, path: Path_) -> float | int:
    what = "whole number" if kind is int else "number"
    unit = " of seconds" if kind is float and path not in NOT_SECONDS else ""
    sign = "non-negative" if path in MAY_BE_ZERO else "positive"
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise SettingsError(f"{source} must be a {sign} {what}{unit}, not {value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise SettingsError(f"{source} must be a {sign} {what}{unit}, not {value!r}")
    # Zero or negative waits would spin the loops (a poll every instant, a call that times
    # out at once); nan and inf parse as floats too, and never compare as intended.
    if not math.isfinite(number) or number < 0 or (number == 0 and path not in MAY_BE_ZERO):
        raise SettingsError(f"{source} must be a {sign} {what}{unit}, not {number:g}")
    return number


def _check_runtime(runtime: RuntimeSettings, raw: Mapping[Path_, tuple[str, Any]]) -> None:
    def source(name: str) -> str:
        return raw.get(("runtime", name), (f"runtime.{name}", None))[0]

    host, _, port = runtime.health_bind.rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(
            f"{source('health_bind')} must be host:port, not {runtime.health_bind!r}"
        )
    if runtime.shard and not runtime.leader_elect:
        raise SettingsError(
            f"{source('shard')} needs {source('leader_elect')}: the leader assigns the hosts"
            " to the replicas (docs/sharding.md)"
        )
    if runtime.shard_id is not None and not SHARD_ID.fullmatch(runtime.shard_id):
        raise SettingsError(
            f"{source('shard_id')} must be a DNS label (lower-case letters, digits and '-',"
            f" at most 50 characters), not {runtime.shard_id!r}"
        )
    named = [c for c in runtime.controllers if c != ALL_CONTROLLERS]
    if unknown := [c for c in named if c not in CONTROLLER_NAMES]:
        known = ", ".join(CONTROLLER_NAMES)
        raise SettingsError(f"unknown controller(s): {', '.join(unknown)} (known: {known})")


def health_address(runtime: RuntimeSettings) -> tuple[str, int]:
    """``health_bind`` as (host, port); checked by ``load``."""
    host, _, port = runtime.health_bind.rpartition(":")
    return host, int(port)


__all__ = [
    "DEFAULTS",
    "BmcSettings",
    "FenceMethod",
    "HealthCheckSettings",
    "LogLevel",
    "PowerSettings",
    "RemediationSettings",
    "RequestRemediationBy",
    "RetrySettings",
    "RuntimeSettings",
    "ServeSettings",
    "Settings",
    "SettingsError",
    "TeardownSettings",
    "load",
]
