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
below. Every value is checked the same way whichever place it came from, every number
against its range (``RANGES``); a bad one is one line naming that place, and for a number
its range (``SettingsError``). The Helm chart renders the file from its
values into a ConfigMap and may set single fields by environment.

``metalmend serve`` reads ``serve`` (``metalmend.web.settings.ServeSettings``: bind
address, port, TLS) and ``teardown`` (``metalmend.teardown.policy.settings.TeardownSettings``: the
node-teardown steps' retries) and ``destroy`` (``metalmend.destroy.policy.destroy.DestroySettings``:
Drydock's destroy_nodes, docs/destroy.md) and ``redeploy``
(``metalmend.siteactions.policy.redeploy.RedeploySettings``: redeploy_server's waits,
docs/site-actions.md), besides ``runtime.kubeconfig``.

A new section joins the tree the same way, a frozen dataclass with a documented default
per field (and a range in ``RANGES`` per numeric field), added to ``Settings`` with a
default instance (so a file or environment written before it keeps loading). A section
that a policy reads is defined next to that policy, as ``power`` is (docs/architecture.md
maps each section to its package).
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
from metalmend.policy.hostpower import POLL_EVERY_MAX, PowerSettings, RetrySettings
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

    shard_leader_weight: float = 0.75
    """The leader's share of the hosts beside another replica's (0.1 to 1; 1: the same).
    The leader alone runs the controllers that see the whole fleet (every Node's heartbeat,
    every Machine and health check), so it takes fewer hosts (docs/sharding.md). Kept
    fixed, whatever the number of replicas, so that a replica joining or leaving moves
    hosts only to or from itself; a change of leader moves some between the two."""

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

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30
MINUTE, HOUR, DAY, WEEK = 60.0, 3600.0, 86400.0, 7 * 86400.0


@dataclass(frozen=True)
class Range:
    """The values a numeric setting may take: from ``low`` to ``high`` (both included),
    or 0 where zero has a meaning of its own (``zero``, said in the refusal). Checked at
    start, whichever place the value came from (flag, environment, file, chart values):
    a value outside it is one line naming the setting and this range, and exit code 2.

    Why bounds at all: every number here ends up as a loop's wait, a deadline or a count,
    and one that makes no sense breaks something far from where it was typed (a poll
    budget of 1e-300 overflowed the datetime arithmetic of every host-power reconcile;
    one of 0.001 made a host read every 3,000 s). The bounds are wide (the lab runs at the
    low end, the largest sites we know of well inside the high end); they exclude only
    values no deployment means."""

    low: float
    high: float
    unit: str = "seconds"  # "" for counts, factors and fractions
    zero: str = ""  # what 0 means where 0 is allowed below ``low``; "": not allowed

    def allows(self, number: float) -> bool:
        if not math.isfinite(number):
            return False
        return self.low <= number <= self.high or (bool(self.zero) and number == 0)

    def describe(self, kind: type[float] | type[int]) -> str:
        """``a number of seconds from 0.1 to 3600``, as the refusal says it."""
        what = "whole number" if kind is int else "number"
        unit = f" of {self.unit}" if self.unit else ""
        span = f"a {what}{unit} from {_shown(self.low)} to {_shown(self.high)}"
        return f"0 ({self.zero}) or {span}" if self.zero else span


def _shown(bound: float) -> str:
    return str(int(bound)) if bound == int(bound) else f"{bound:g}"


# Every numeric setting (int or float) of the tree, and its range; a test holds that none
# is missing. Seconds unless said otherwise.
RANGES: dict[tuple[str, str], Range] = {
    # ---- bmc (metalmend.bmc.settings) --------------------------------------------------
    ("bmc", "timeout"): Range(0.1, HOUR),
    ("bmc", "max_in_flight"): Range(1, 10_000, ""),
    ("bmc", "max_in_flight_per_namespace"): Range(1, 10_000, ""),
    ("bmc", "max_response_bytes"): Range(4 * KIB, GIB, "bytes"),
    ("bmc", "max_message_chars"): Range(40, 100_000, "characters"),
    # ---- power (metalmend.policy.hostpower.PowerSettings) ------------------------------
    ("runtime", "shard_leader_weight"): Range(0.1, 1, ""),
    ("power", "soft_timeout"): Range(0, DAY),  # 0: hard power-off at once
    # at most POLL_EVERY_MAX: the budget never stretches an idle poll beyond it either
    ("power", "poll_interval"): Range(0.1, POLL_EVERY_MAX),
    # at least 1 read a second: with fewer, a few hosts are read hours apart
    ("power", "poll_budget"): Range(1, 100_000, "BMC reads a second", zero="no limit"),
    # idle polls read together (policy.hostpower.poll_grid); 0: each at its own moment
    ("power", "poll_batch"): Range(1, 10_000, "BMC reads", zero="no batching"),
    ("power", "transition_poll"): Range(0.01, MINUTE),
    ("power", "first_poll"): Range(0, MINUTE),  # 0: read again right after a command
    ("power", "command_retry"): Range(0.1, HOUR),
    # ---- power_retry (metalmend.policy.hostpower.RetrySettings) -------------------------
    ("power_retry", "base"): Range(0.01, HOUR),
    ("power_retry", "cap"): Range(0.01, DAY),
    ("power_retry", "authentication_first"): Range(1, DAY),
    ("power_retry", "authentication_factor"): Range(1, 100, ""),
    ("power_retry", "authentication_cap"): Range(1, WEEK),
    ("power_retry", "jitter"): Range(0, 1, ""),  # a fraction of the delay, added
    # ---- health_checks ------------------------------------------------------------------
    ("health_checks", "template_retry"): Range(0.1, DAY),
    # ---- remediation (metalmend.policy.remediation.Settings) ----------------------------
    ("remediation", "confirm_window"): Range(0.1, HOUR),
    ("remediation", "confirm_reads"): Range(1, 100, ""),
    ("remediation", "evacuation_poll"): Range(0.1, HOUR),
    ("remediation", "retry_base"): Range(0.1, DAY),
    ("remediation", "retry_cap"): Range(1, WEEK),
    # ---- serve (metalmend.web.settings.ServeSettings) -----------------------------------
    ("serve", "port"): Range(1, 65_535, ""),
    ("serve", "token_cache_seconds"): Range(0.1, HOUR),
    ("serve", "token_cache_size"): Range(1, 10_000_000, "answers"),
    ("serve", "auth_failures_burst"): Range(1, 100_000, "failures"),
    ("serve", "auth_failure_interval"): Range(0.001, HOUR),
    ("serve", "max_body_bytes"): Range(64 * KIB, GIB, "bytes"),
    ("serve", "max_design_documents"): Range(1, 10_000_000, "documents"),
    ("serve", "max_design_values"): Range(1, 1_000_000_000, "values"),
    # ---- teardown (metalmend.teardown.policy.settings.TeardownSettings) -----------------
    ("teardown", "eviction_retry"): Range(0.1, HOUR),
    ("teardown", "kubelet_stopped_after"): Range(1, HOUR),
    ("teardown", "shutdown_kubelet_timeout"): Range(1, DAY),
    ("teardown", "etcd_poll_interval"): Range(0.1, HOUR),
    # ---- destroy (metalmend.destroy.policy.destroy.DestroySettings) ---------------------
    ("destroy", "power_off_timeout"): Range(1, DAY),
    ("destroy", "erase_timeout"): Range(1, WEEK),
    ("destroy", "poll_interval"): Range(0.1, HOUR),
    ("destroy", "bmc_retry"): Range(0.1, HOUR),
    ("destroy", "bmc_timeout"): Range(1, DAY),
    ("destroy", "release_timeout"): Range(1, DAY),
    ("destroy", "lease_seconds"): Range(1, HOUR),
    # ---- redeploy (metalmend.siteactions.policy.redeploy.RedeploySettings) --------------
    ("redeploy", "destroy_timeout"): Range(1, WEEK),
    ("redeploy", "provision_timeout"): Range(1, WEEK),
    ("redeploy", "node_ready_timeout"): Range(1, WEEK),
    ("redeploy", "etcd_timeout"): Range(1, WEEK),
    ("redeploy", "poll_interval"): Range(0.1, HOUR),
}
HEALTH_PORT = Range(0, 65_535, "")  # runtime.health_bind's port; 0: any free port


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
    allowed = RANGES[path]  # a new numeric field needs its range (tests/unit/test_settings.py)
    refusal = f"{source} must be {allowed.describe(kind)}, not "
    try:
        if isinstance(value, bool):
            raise ValueError
        number = kind(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError, OverflowError):
        raise SettingsError(f"{refusal}{value!r}") from None
    if kind is int and isinstance(value, float) and value != number:
        raise SettingsError(f"{refusal}{value!r}")
    # nan and inf parse as floats too, and never compare as intended.
    if not allowed.allows(number):
        raise SettingsError(f"{refusal}{number:g}")
    return number


def _check_runtime(runtime: RuntimeSettings, raw: Mapping[Path_, tuple[str, Any]]) -> None:
    def source(name: str) -> str:
        return raw.get(("runtime", name), (f"runtime.{name}", None))[0]

    host, _, port = runtime.health_bind.rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(
            f"{source('health_bind')} must be host:port, not {runtime.health_bind!r}"
        )
    if not HEALTH_PORT.allows(int(port)):
        raise SettingsError(
            f"{source('health_bind')} must be host:port with a port from 0 to 65535,"
            f" not {runtime.health_bind!r}"
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
