"""The ``metalmend`` command line."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend import __version__
from metalmend.kube.leader import LeadershipLost
from metalmend.lab import lab as lab_
from metalmend.lab.assets import AssetsError
from metalmend.lab.controlplane import ControlPlaneError

# Locals are never shown in tracebacks: they can hold BMC passwords.
app = typer.Typer(
    no_args_is_help=True, add_completion=False, help=__doc__, pretty_exceptions_show_locals=False
)
lab_app = typer.Typer(no_args_is_help=True, help="A real local cluster for demos and tests.")
app.add_typer(lab_app, name="lab")
out = Console()
err = Console(stderr=True)

LabDir = Annotated[
    Path, typer.Option("--dir", help="Lab state directory.", envvar="METALMEND_LAB_DIR")
]
NodeGrace = Annotated[
    float,
    typer.Option("--node-grace", help="Seconds without heartbeats before a Node is Unknown."),
]


def fail(message: str, code: int = 1) -> None:
    err.print(f"[red]metalmend:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def version() -> None:
    """Print metalmend's version."""
    out.print(__version__)


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
    controllers: Annotated[
        str, typer.Option(help="Controllers 'metalmend run' runs against the lab ('' for none).")
    ] = lab_.DEFAULT_CONTROLLERS,
) -> None:
    """Start the lab: control plane, CRDs, and (with --hosts) BMCs, hosts and kubelets."""
    if bmc not in ("redfish", "ipmi", "mixed"):
        fail(f"--bmc must be redfish, ipmi or mixed, not {bmc!r}", code=2)
    options = lab_.LabOptions(
        lab_dir=lab_dir,
        node_monitor_grace_period=node_grace,
        hosts=hosts,
        bmc=bmc,
        boot_delay=boot_delay,
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
    if lab_.down(lab_dir):
        out.print("lab stopped")
    else:
        out.print(f"no lab is running in {lab_dir}")


@lab_app.command("status")
def lab_status(lab_dir: LabDir = Path(".lab")) -> None:
    """Show what the lab runs."""
    report = lab_.status(lab_dir)
    if not report.running:
        out.print(f"no lab is running in {lab_dir}")
        raise typer.Exit(1)
    readiness = "[green]ok[/green]" if report.apiserver_ready else "[red]not ready[/red]"
    out.print(f"server {report.server}  readyz {readiness}")
    out.print(f"kubeconfig {report.kubeconfig}")
    table = Table("component", "pid", "running")
    for c in report.components:
        table.add_row(c.name, str(c.pid), "yes" if c.running else "[red]no[/red]")
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
    try:
        lab_.inject_fault(lab_dir, host, kind)
    except ValueError as error:
        fail(str(error), code=2)
    out.print(f"{host}: {kind}")


@app.command()
def demo(
    lab_dir: LabDir = Path(".lab-demo"),
    keep: Annotated[bool, typer.Option(help="Keep the lab running until Ctrl-C.")] = False,
) -> None:
    """Start the lab and show metalmend working in it."""
    from metalmend.demo import run_demo

    run_demo(lab_dir, out, keep=keep)


@app.command("run")
def run_command(
    kubeconfig: Annotated[
        Path | None,
        typer.Option(help="Kubeconfig; default: in-cluster, $KUBECONFIG, ~/.kube/config."),
    ] = None,
    controllers: Annotated[
        str, typer.Option(help="Comma-separated controllers to run; 'all' for every one.")
    ] = "all",
    leader_elect: Annotated[
        bool, typer.Option(help="Run controllers only while holding the leader Lease.")
    ] = False,
    leader_election_namespace: Annotated[
        str | None, typer.Option(help="Namespace of the Lease (default: our own, or 'default').")
    ] = None,
    health_bind: Annotated[
        str, typer.Option(help="host:port for /healthz, /readyz and /metrics.")
    ] = "127.0.0.1:8081",
    namespace: Annotated[
        str | None, typer.Option(help="Watch only this namespace (default: all).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning or error.")] = "info",
    bmc_ca_bundle: Annotated[
        Path | None, typer.Option(help="CA bundle trusted for Redfish BMCs (besides the system's).")
    ] = None,
    bmc_timeout: Annotated[float, typer.Option(help="Seconds allowed for one BMC call.")] = 30.0,
    soft_power_off_timeout: Annotated[
        float, typer.Option(help="Seconds a soft power-off may take before it is made hard.")
    ] = 180.0,
    power_poll_interval: Annotated[
        float, typer.Option(help="Seconds between BMC power reads of a settled host.")
    ] = 20.0,
    fence: Annotated[
        str,
        typer.Option(
            help="How remediation fences a Node once its host is off: delete-node, or"
            " out-of-service-taint (Kubernetes >= 1.28)."
        ),
    ] = "delete-node",
    remediation_retry_base: Annotated[
        float,
        typer.Option(help="Seconds before retrying a failed remediation (doubles each time)."),
    ] = 30.0,
    request_remediation_by: Annotated[
        str,
        typer.Option(
            help="How health checks without a remediationTemplate ask for remediation:"
            " conditions, or annotation (host.metal3.io/external-remediation)."
        ),
    ] = "conditions",
) -> None:
    """Run metalmend's controllers against a cluster."""
    import asyncio

    from metalmend import log, runner
    from metalmend.controllers import REGISTRY, RunOptions
    from metalmend.controllers import all as _all  # noqa: F401  (registers every controller)

    chosen = list(REGISTRY) if controllers == "all" else [c for c in controllers.split(",") if c]
    if unknown := runner.unknown_controllers(chosen):
        known = ", ".join(REGISTRY) or "none yet"
        fail(f"unknown controller(s): {', '.join(unknown)} (known: {known})", code=2)
    if fence not in ("delete-node", "out-of-service-taint"):
        fail(f"--fence must be delete-node or out-of-service-taint, not {fence!r}", code=2)
    if request_remediation_by not in ("conditions", "annotation"):
        fail(
            "--request-remediation-by must be conditions or annotation,"
            f" not {request_remediation_by!r}",
            code=2,
        )
    if remediation_retry_base <= 0:
        fail("--remediation-retry-base must be positive", code=2)
    host, _, port = health_bind.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--health-bind must be host:port, not {health_bind!r}", code=2)
    log.setup(log_level)
    config = runner.RunConfig(
        kubeconfig=kubeconfig,
        controllers=chosen,
        leader_elect=leader_elect,
        leader_election_namespace=leader_election_namespace,
        health_host=host,
        health_port=int(port),
        options=RunOptions(
            namespace=namespace,
            bmc_ca_bundle=str(bmc_ca_bundle) if bmc_ca_bundle else None,
            bmc_timeout=bmc_timeout,
            soft_power_off_timeout=soft_power_off_timeout,
            power_poll_interval=power_poll_interval,
            fence_method=fence,  # type: ignore[arg-type]  # checked above
            remediation_retry_base=remediation_retry_base,
            request_remediation_by=request_remediation_by,  # type: ignore[arg-type]
        ),
    )
    try:
        asyncio.run(runner.run(config))
    except runner.ClusterUnavailable as error:
        fail(str(error), code=2)
    except OSError as error:
        fail(str(error), code=2)
    except LeadershipLost as error:
        fail(f"{error}; exiting so that a fresh replica can stand again", code=1)


def main() -> None:
    try:
        app()
    except (AssetsError, ControlPlaneError, lab_.LabError) as error:
        err.print(f"metalmend: {error}", highlight=False, markup=False, soft_wrap=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
