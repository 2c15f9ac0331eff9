"""The ``metalmend`` command line."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from metalmend import __version__
from metalmend import settings as settings_
from metalmend.cli.design import design_app
from metalmend.cli.node import etcd_app, node_app
from metalmend.cli.site import site_app
from metalmend.kube.leader import LeadershipLost

# Locals are never shown in tracebacks: they can hold BMC passwords.
app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_show_locals=False
)
credentials_app = typer.Typer(no_args_is_help=True, help="BMC credential Secrets.")
out = Console()
err = Console(stderr=True)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]metalmend:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print metalmend's version."""
    out.print(__version__)


# Verbs that other distributions add to this command, found by their entry points in
# this group: `register(app)` adds them. The lab and the demos (metalmend-lab, installed
# from a checkout: lab/pyproject.toml) add `lab`, `demo` and `demo-site`; metalmend itself
# never imports them, so the production wheel and image run without them.
PLUGIN_GROUP = "metalmend.cli"
LAB_PLUGIN = "lab"
LAB_VERBS = ("lab", "demo", "demo-site")
LAB_MISSING = (
    "the lab and the demos come with metalmend-lab, which is not installed here: in a"
    " checkout of metalmend, run 'pip install ./lab' (make venv does)"
)


def _add_plugins(app: typer.Typer) -> None:
    added = set()
    for entry in importlib.metadata.entry_points(group=PLUGIN_GROUP):
        try:
            register: Callable[[typer.Typer], None] = entry.load()
        except ModuleNotFoundError as error:
            # Metadata left behind by a package that is gone: as if not installed.
            if (error.name or "").partition(".")[0] != entry.module.partition(".")[0]:
                raise
            continue
        register(app)
        added.add(entry.name)
    if LAB_PLUGIN not in added:
        for verb in LAB_VERBS:
            app.command(
                verb,
                help="(not installed: needs metalmend-lab, from a checkout: pip install ./lab)",
                add_help_option=False,
                context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
            )(_lab_missing)


def _lab_missing() -> None:
    fail(LAB_MISSING)


_add_plugins(app)
# After the plugins' verbs, so that --help lists `lab` first among the groups, as before.
app.add_typer(credentials_app, name="credentials")
app.add_typer(node_app, name="node")  # the node-teardown API of `metalmend serve`
app.add_typer(etcd_app, name="etcd")
app.add_typer(design_app, name="design")  # the design revisions (Deckhand) of `metalmend serve`
app.add_typer(site_app, name="site")  # configdocs and site actions (Shipyard) of `metalmend serve`


# `metalmend run`'s flags, each setting one field of the settings tree (metalmend.settings):
# (section, field) by parameter name. A flag given on the command line wins over the
# environment and the settings file; its default shown in --help is the tree's.
RUN_FLAGS: dict[str, tuple[str, str]] = {
    "kubeconfig": ("runtime", "kubeconfig"),
    "controllers": ("runtime", "controllers"),
    "leader_elect": ("runtime", "leader_elect"),
    "leader_election_namespace": ("runtime", "leader_election_namespace"),
    "shard": ("runtime", "shard"),
    "shard_id": ("runtime", "shard_id"),
    "health_bind": ("runtime", "health_bind"),
    "namespace": ("runtime", "namespace"),
    "secret_namespaces": ("runtime", "secret_namespaces"),
    "log_level": ("runtime", "log_level"),
    "bmc_ca_bundle": ("bmc", "ca_bundle"),
    "bmc_timeout": ("bmc", "timeout"),
    "bmc_allow_insecure_http": ("bmc", "allow_insecure_http"),
    "bmc_allowed_network": ("bmc", "allowed_networks"),
    "bmc_allow_disable_certificate_verification": (
        "bmc",
        "allow_disable_certificate_verification",
    ),
    "bmc_trust_system_cas": ("bmc", "trust_system_cas"),
    "soft_power_off_timeout": ("power", "soft_timeout"),
    "power_poll_interval": ("power", "poll_interval"),
    "power_poll_budget": ("power", "poll_budget"),
    "fence": ("remediation", "fence"),
    "remediation_retry_base": ("remediation", "retry_base"),
    "request_remediation_by": ("health_checks", "request_remediation_by"),
}
DEFAULTS = settings_.DEFAULTS


@app.command("run")
def run_command(
    context: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(
            help="YAML settings file (sections runtime, bmc, power, power_retry,"
            " health_checks, remediation); flags and METALMEND_<SECTION>_<FIELD>"
            " environment variables override it."
        ),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig; default: in-cluster, $KUBECONFIG, ~/.kube/config."),
    ] = DEFAULTS.runtime.kubeconfig,
    controllers: Annotated[
        str, typer.Option(help="Comma-separated controllers to run; 'all' for every one.")
    ] = ",".join(DEFAULTS.runtime.controllers),
    leader_elect: Annotated[
        bool, typer.Option(help="Run controllers only while holding the leader Lease.")
    ] = DEFAULTS.runtime.leader_elect,
    leader_election_namespace: Annotated[
        str | None, typer.Option(help="Namespace of the Lease (default: our own, or 'default').")
    ] = DEFAULTS.runtime.leader_election_namespace,
    shard: Annotated[
        bool,
        typer.Option(
            help="Share the hosts with the other replicas run with --shard (needs"
            " --leader-elect; docs/sharding.md)."
        ),
    ] = DEFAULTS.runtime.shard,
    shard_id: Annotated[
        str | None,
        typer.Option(help="This replica's name among the shards (default: the host name)."),
    ] = DEFAULTS.runtime.shard_id,
    health_bind: Annotated[
        str, typer.Option(help="host:port for /healthz, /readyz and /metrics.")
    ] = DEFAULTS.runtime.health_bind,
    namespace: Annotated[
        str | None, typer.Option(help="Watch only this namespace (default: all).")
    ] = DEFAULTS.runtime.namespace,
    secret_namespaces: Annotated[
        str,
        typer.Option(
            help="Without --namespace: comma-separated namespaces whose BMC Secrets may be"
            " read, one RoleBinding each (default: all, which needs cluster-wide list/watch)."
        ),
    ] = ",".join(DEFAULTS.runtime.secret_namespaces),
    log_level: Annotated[
        settings_.LogLevel, typer.Option(case_sensitive=False, help="How much to log.")
    ] = DEFAULTS.runtime.log_level,
    bmc_ca_bundle: Annotated[
        Path | None,
        typer.Option(
            help="CA bundle trusted for Redfish BMCs' certificates (the only one by default)."
        ),
    ] = None,
    bmc_timeout: Annotated[
        float, typer.Option(help="Seconds allowed for one BMC call.")
    ] = DEFAULTS.bmc.timeout,
    bmc_allow_insecure_http: Annotated[
        bool,
        typer.Option(
            help="Allow redfish+http:// BMC addresses: BMC passwords then cross the network"
            " in cleartext."
        ),
    ] = DEFAULTS.bmc.allow_insecure_http,
    bmc_allowed_network: Annotated[
        list[str] | None,
        typer.Option(
            help="A network (CIDR) BMC addresses must lie in, host names resolved; repeat"
            " for several (default: any address). Secrets bound with '*' are used only"
            " inside these networks."
        ),
    ] = None,
    bmc_allow_disable_certificate_verification: Annotated[
        bool,
        typer.Option(
            help="Honour spec.bmc.disableCertificateVerification on hosts whose Secret binds"
            " them by name: their creators may then send its password to any TLS listener."
            " Never for Secrets bound with '*'."
        ),
    ] = DEFAULTS.bmc.allow_disable_certificate_verification,
    bmc_trust_system_cas: Annotated[
        bool,
        typer.Option(
            help="Trust the system's CAs for BMC certificates besides --bmc-ca-bundle (never"
            " for Secrets bound with '*')."
        ),
    ] = DEFAULTS.bmc.trust_system_cas,
    soft_power_off_timeout: Annotated[
        float, typer.Option(help="Seconds a soft power-off may take before it is made hard.")
    ] = DEFAULTS.power.soft_timeout,
    power_poll_interval: Annotated[
        float, typer.Option(help="Seconds between BMC power reads of a settled host.")
    ] = DEFAULTS.power.poll_interval,
    power_poll_budget: Annotated[
        float,
        typer.Option(
            help="Routine BMC power reads a second this process allows itself (0: no limit);"
            " above budget x interval hosts, each host is read every hosts/budget seconds."
        ),
    ] = DEFAULTS.power.poll_budget,
    fence: Annotated[
        settings_.FenceMethod,
        typer.Option(
            help="How remediation fences a Node once its host is off (the taint needs"
            " Kubernetes >= 1.28)."
        ),
    ] = DEFAULTS.remediation.fence,
    remediation_retry_base: Annotated[
        float,
        typer.Option(help="Seconds before retrying a failed remediation (doubles each time)."),
    ] = DEFAULTS.remediation.retry_base,
    request_remediation_by: Annotated[
        settings_.RequestRemediationBy,
        typer.Option(
            help="How health checks without a remediationTemplate ask for remediation:"
            " Cluster API conditions, or the annotation host.metal3.io/external-remediation."
        ),
    ] = DEFAULTS.health_checks.request_remediation_by,
) -> None:
    """Run metalmend's controllers against a cluster."""
    import asyncio

    from metalmend import log, runner

    settings = _load_settings(context, config, RUN_FLAGS)
    log.setup(settings.runtime.log_level)
    try:
        asyncio.run(runner.run(runner.RunConfig(settings)))
    except runner.ClusterUnavailable as error:
        fail(str(error), code=2)
    except OSError as error:
        fail(str(error), code=2)
    except LeadershipLost as error:
        fail(f"{error}; exiting so that a fresh replica can stand again", code=1)


def _load_settings(
    context: typer.Context, config: Path | None, flags: dict[str, tuple[str, str]]
) -> settings_.Settings:
    """The settings tree from the flags given on the command line, the environment, the
    file and the defaults (docs/runtime.md); a bad value is one line and exit code 2."""
    import os

    given = {
        path: (f"--{name.replace('_', '-')}", context.params[name])
        for name, path in flags.items()
        if _on_command_line(context, name)
    }
    try:
        return settings_.load(config, os.environ, given)
    except settings_.SettingsError as error:
        fail(str(error), code=2)


# `metalmend serve`'s flags, as RUN_FLAGS are `metalmend run`'s.
SERVE_FLAGS: dict[str, tuple[str, str]] = {
    "kubeconfig": ("runtime", "kubeconfig"),
    "bind_address": ("serve", "bind_address"),
    "port": ("serve", "port"),
    "metrics_bind": ("serve", "metrics_bind"),
    "tls_cert": ("serve", "tls_cert"),
    "tls_key": ("serve", "tls_key"),
    "database_url": ("serve", "database_url"),
    "site_namespaces": ("serve", "site_namespaces"),
    "accept_store": ("serve", "accept_store"),
    "max_body_bytes": ("serve", "max_body_bytes"),
    "log_level": ("runtime", "log_level"),
}


@app.command("serve")
def serve_command(
    context: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option(help="YAML settings file (sections runtime, serve, teardown)."),
    ] = None,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig; default: in-cluster, $KUBECONFIG, ~/.kube/config."),
    ] = DEFAULTS.runtime.kubeconfig,
    bind_address: Annotated[
        str, typer.Option(help="Address to listen on (not loopback: TLS required).")
    ] = DEFAULTS.serve.bind_address,
    port: Annotated[int, typer.Option(help="TCP port to listen on.")] = DEFAULTS.serve.port,
    metrics_bind: Annotated[
        str, typer.Option(help="host:port for serve's /metrics (no token); empty: none.")
    ] = DEFAULTS.serve.metrics_bind,
    tls_cert: Annotated[
        Path | None, typer.Option(help="PEM certificate to serve HTTPS with (with --tls-key).")
    ] = None,
    tls_key: Annotated[Path | None, typer.Option(help="PEM private key of --tls-cert.")] = None,
    database_url: Annotated[
        str,
        typer.Option(help="sqlite:///PATH or postgresql+psycopg://... (docs/design-store.md)."),
    ] = DEFAULTS.serve.database_url,
    site_namespaces: Annotated[
        str,
        typer.Option(
            help="Comma-separated namespaces whose BareMetalHosts and Machines site actions"
            " may write (docs/site-actions.md); empty: none."
        ),
    ] = ",".join(DEFAULTS.serve.site_namespaces),
    accept_store: Annotated[
        str,
        typer.Option(
            help="Serve the database's store although another one was recorded: its id,"
            " as the refusal to start prints it (docs/design-store.md)."
        ),
    ] = DEFAULTS.serve.accept_store,
    max_body_bytes: Annotated[
        int,
        typer.Option(
            help="Largest design body (Deckhand's put, Shipyard's configdocs) in bytes;"
            " larger: 413 (docs/design-store.md, Limits)."
        ),
    ] = DEFAULTS.serve.max_body_bytes,
    log_level: Annotated[
        settings_.LogLevel, typer.Option(case_sensitive=False, help="How much to log.")
    ] = DEFAULTS.runtime.log_level,
) -> None:
    """Serve Airship's node-teardown API (Promenade's, under /promenade/api/v1.0), the site
    design revisions (Deckhand's), destroy tasks (Drydock's) and configdocs and site actions
    (Shipyard's, under /shipyard/api/v1.0)."""
    import asyncio

    from metalmend import log
    from metalmend.db import DatabaseError
    from metalmend.kube.client import ClusterUnavailable
    from metalmend.serve.server import serve
    from metalmend.serve.settings import ServeSettingsError

    settings = _load_settings(context, config, SERVE_FLAGS)
    log.setup(settings.runtime.log_level)
    try:
        asyncio.run(serve(settings))
    except (ServeSettingsError, ClusterUnavailable, OSError, DatabaseError) as error:
        fail(str(error), code=2)


def _on_command_line(context: typer.Context, parameter: str) -> bool:
    # By name: typer vendors its own copy of click's ParameterSource in recent versions.
    source = context.get_parameter_source(parameter)
    return source is not None and source.name == "COMMANDLINE"


@credentials_app.command("bind")
def credentials_bind(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig; default: in-cluster, $KUBECONFIG, ~/.kube/config."),
    ] = None,
    namespace: Annotated[
        str | None, typer.Option(help="Only the hosts of this namespace (default: all).")
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Say what would change; change nothing.")] = False,
) -> None:
    """Label and bind each BMC Secret to the hosts that name it today (migration)."""
    import httpx2
    from lightkube import ApiError, Client

    from metalmend.bmc.binding import bind
    from metalmend.kube.client import FIELD_MANAGER, ClusterUnavailable, load_config

    try:
        client = Client(load_config(kubeconfig), field_manager=FIELD_MANAGER)
        bindings = bind(client, namespace, dry_run=dry_run)
    except ClusterUnavailable as error:
        fail(str(error), code=2)
    except ApiError as error:
        fail(f"cannot list BareMetalHosts: {error.status.code} {error.status.message}", code=2)
    except (OSError, httpx2.HTTPError) as error:
        fail(f"cannot reach the API server: {error}", code=2)
    if not bindings:
        out.print("no host names a BMC Secret", highlight=False)
    for binding in bindings:
        out.print(binding.describe(dry_run), highlight=False, markup=False, soft_wrap=True)
    if any(b.problem for b in bindings):
        raise typer.Exit(1)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
