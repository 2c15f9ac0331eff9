"""The ``metalmend`` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend import __version__
from metalmend import settings as settings_
from metalmend.cli_design import design_app
from metalmend.cli_node import etcd_app, node_app
from metalmend.cli_site import site_app
from metalmend.kube.leader import LeadershipLost

# The lab (and its extras: sushy-tools, bcrypt) is imported inside the lab commands only, so
# that `metalmend run` works where only the controller's dependencies are installed.
if TYPE_CHECKING:
    from metalmend.lab import lab as lab_

# Locals are never shown in tracebacks: they can hold BMC passwords.
app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_show_locals=False
)
lab_app = typer.Typer(no_args_is_help=True, help="A real local cluster for demos and tests.")
app.add_typer(lab_app, name="lab")
credentials_app = typer.Typer(no_args_is_help=True, help="BMC credential Secrets.")
app.add_typer(credentials_app, name="credentials")
app.add_typer(node_app, name="node")  # the node-teardown API of `metalmend serve`
app.add_typer(etcd_app, name="etcd")
app.add_typer(design_app, name="design")  # the design revisions (Deckhand) of `metalmend serve`
app.add_typer(site_app, name="site")  # configdocs and site actions (Shipyard) of `metalmend serve`
out = Console()
err = Console(stderr=True)

LabDir = Annotated[
    Path, typer.Option("--dir", help="Lab state directory.", envvar="METALMEND_LAB_DIR")
]
NodeGrace = Annotated[
    float,
    typer.Option("--node-grace", help="Seconds without heartbeats before a Node is Unknown."),
]


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]metalmend:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print metalmend's version."""
    out.print(__version__)


# The lab's own default (lab.lab.DEFAULT_CONTROLLERS), written here too so that --help
# does not load the lab; tests/unit/test_import_contract.py checks that they agree.
LAB_CONTROLLERS = "node-link,host-power,machine-health-check,metal3-remediation,machine-remediation"
LAB_PROVISION_DELAY = 2.0  # lab.provisioner.DEFAULT_DELAY, likewise


@lab_app.command("up")
def lab_up(
    lab_dir: LabDir = Path(".lab"),
    detach: Annotated[bool, typer.Option(help="Return once ready; stop with 'lab down'.")] = False,
    node_grace: NodeGrace = 20.0,
    hosts: Annotated[int, typer.Option(help="Bare-metal hosts to simulate.", min=0, max=50)] = 0,
    bmc: Annotated[str, typer.Option(help="Their BMCs: redfish, ipmi or mixed.")] = "mixed",
    boot_delay: Annotated[
        float, typer.Option(help="Seconds from power-on until a host's kubelet registers.")
    ] = 3.0,
    erase_seconds: Annotated[
        float, typer.Option(help="Seconds a drive's secure erase takes (Redfish hosts).", min=0)
    ] = 5.0,
    provision_delay: Annotated[
        float,
        typer.Option(help="Seconds the lab's provisioner takes to write an image.", min=0),
    ] = LAB_PROVISION_DELAY,
    controllers: Annotated[
        str, typer.Option(help="Controllers 'metalmend run' runs against the lab ('' for none).")
    ] = LAB_CONTROLLERS,
) -> None:
    """Start the lab: control plane, CRDs, and (with --hosts) BMCs, hosts and kubelets."""
    from metalmend.lab import lab as lab_

    if bmc not in ("redfish", "ipmi", "mixed"):
        fail(f"--bmc must be redfish, ipmi or mixed, not {bmc!r}", code=2)
    options = lab_.LabOptions(
        lab_dir=lab_dir,
        node_monitor_grace_period=node_grace,
        hosts=hosts,
        bmc=bmc,
        boot_delay=boot_delay,
        erase_seconds=erase_seconds,
        provision_delay=provision_delay,
        controllers=controllers,
    )
    if detach:
        state = lab_.up_detached(options)
        _print_ready(state, foreground=False)
        return
    lab_.up(options, lambda state: _print_ready(state, foreground=True))
    out.print("lab stopped")


def _print_ready(state: lab_.LabState, foreground: bool) -> None:
    out.print(f"[green]lab ready[/green] in {state.started_in_seconds:.1f}s: {state.server}")
    out.print(f"  kubectl --kubeconfig {state.kubeconfig} get baremetalhosts")
    out.print("  Ctrl-C stops it" if foreground else "  'metalmend lab down' stops it")
    sys.stdout.flush()


@lab_app.command("down")
def lab_down(lab_dir: LabDir = Path(".lab")) -> None:
    """Stop the lab and every process it started."""
    from metalmend.lab import lab as lab_

    if lab_.down(lab_dir):
        out.print("lab stopped")
    else:
        out.print(f"no lab is running in {lab_dir}")


@lab_app.command("status")
def lab_status(lab_dir: LabDir = Path(".lab")) -> None:
    """Show what the lab runs."""
    from metalmend.lab import lab as lab_

    report = lab_.status(lab_dir)
    if not report.running:
        out.print(f"no lab is running in {lab_dir}")
        raise typer.Exit(1)
    readiness = "[green]ok[/green]" if report.apiserver_ready else "[red]not ready[/red]"
    out.print(f"server {report.server}  readyz {readiness}")
    out.print(f"kubeconfig {report.kubeconfig}")
    from metalmend.lab.serve import ENDPOINTS, Endpoints

    if (endpoints := Endpoints.read(lab_dir)) is not None:
        out.print(f"teardown API {endpoints.url}  ({lab_dir / ENDPOINTS})")
    table = Table("component", "pid", "running", "restarts")
    for c in report.components:
        running = "yes" if c.running else "[red]no[/red]"
        table.add_row(c.name, str(c.pid), running, str(c.restarts))
    out.print(table)
    if report.hosts:
        hosts_table = Table(
            "host", "BMC", "power", "kubelet", "Node", "Ready", "pods", "BMC reachable"
        )
        for h in report.hosts:
            hosts_table.add_row(
                h.name, h.bmc, h.power, h.kubelet, "yes" if h.node else "no", h.ready,
                str(h.pods), "yes" if h.bmc_reachable else f"[red]no[/red] ({h.bmc_line})",
            )  # fmt: skip
        out.print(hosts_table)
    if (site := report.site_etcd) is not None:
        healthy = sum(1 for m in site.members if m.healthy)
        out.print(
            f"site etcd {site.cluster}: {healthy} of {len(site.members)} members healthy"
            f" (the site needs {site.threshold}); design_ref {site.design_ref}"
        )
        etcd_table = Table("etcd member", "client URL", "process", "healthy")
        for m in site.members:
            ok = "yes" if m.healthy else "[red]no[/red]"
            etcd_table.add_row(m.host, m.client_url, m.process, ok)
        out.print(etcd_table)


@lab_app.command("fault")
def lab_fault(
    host: Annotated[str, typer.Argument(help="Host name, e.g. worker-0.")],
    kind: Annotated[
        str,
        typer.Argument(
            help="hang | recover | bmc-down | bmc-up | bmc-slow | ignore-soft | honour-soft"
        ),
    ],
    lab_dir: LabDir = Path(".lab"),
) -> None:
    """Inject a fault into a lab host (a hung kernel, an unreachable or slow BMC...)."""
    from metalmend.lab import lab as lab_

    try:
        lab_.inject_fault(lab_dir, host, kind)
    except ValueError as error:
        fail(str(error), code=2)
    out.print(f"{host}: {kind}")


@lab_app.command("design")
def lab_design(
    lab_dir: LabDir = Path(".lab"),
    output: Annotated[
        Path | None, typer.Option("--output", help="Write the documents here, not to stdout.")
    ] = None,
) -> None:
    """Print the running lab's site design: documents for the design store's bucket."""
    from metalmend.lab import lab as lab_

    try:
        text = lab_.site_design(lab_dir)
    except lab_.LabError as error:
        fail(str(error))
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        err.print(f"site design written to {output}")


@app.command()
def demo(
    lab_dir: LabDir = Path(".lab-demo"),
    keep: Annotated[bool, typer.Option(help="Keep the lab running until Ctrl-C.")] = False,
) -> None:
    """Start the lab and show metalmend working in it."""
    from metalmend.demo import run_demo

    run_demo(lab_dir, out, keep=keep)


@app.command("demo-site")
def demo_site(
    lab_dir: LabDir = Path(".lab-demo"),
    keep: Annotated[bool, typer.Option(help="Keep the lab running until Ctrl-C.")] = False,
) -> None:
    """Start the lab and show site actions: the design deployed, a server redeployed live,
    the intermediate-commit guard."""
    from metalmend.demo_site import run_site_demo

    run_site_demo(lab_dir, out, keep=keep)


# `metalmend run`'s flags, each setting one field of the settings tree (metalmend.settings):
# (section, field) by parameter name. A flag given on the command line wins over the
# environment and the settings file; its default shown in --help is the tree's.
RUN_FLAGS: dict[str, tuple[str, str]] = {
    "kubeconfig": ("runtime", "kubeconfig"),
    "controllers": ("runtime", "controllers"),
    "leader_elect": ("runtime", "leader_elect"),
    "leader_election_namespace": ("runtime", "leader_election_namespace"),
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


def _lab_errors() -> tuple[type[Exception], ...]:
    """The lab's expected failures (a missing binary, a control plane that did not start),
    shown as one line. Only a lab command can raise them, and it has loaded the lab."""
    if "metalmend.lab.lab" not in sys.modules:
        return ()
    from metalmend.lab import lab as lab_
    from metalmend.lab.assets import AssetsError
    from metalmend.lab.controlplane import ControlPlaneError

    return (AssetsError, ControlPlaneError, lab_.LabError)


# Top-level modules of the `lab` extra (pyproject.toml): their absence means the extra is
# not installed, which a lab command says in one line instead of a traceback.
LAB_EXTRA_MODULES = frozenset({"sushy_tools", "sushy", "bcrypt"})
LAB_EXTRA_HINT = "pip install 'metalmend[lab]'"


def main() -> None:
    try:
        app()
    except ModuleNotFoundError as error:
        if (error.name or "").partition(".")[0] not in LAB_EXTRA_MODULES:
            raise
        err.print(
            f"metalmend: the lab and the demo need the 'lab' extra ({LAB_EXTRA_HINT});"
            f" {error.name} is not installed",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
        sys.exit(1)
    except Exception as error:
        if not isinstance(error, _lab_errors()):
            raise
        err.print(f"metalmend: {error}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
