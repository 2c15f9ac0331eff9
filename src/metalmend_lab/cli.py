"""``metalmend lab``, ``metalmend demo`` and ``metalmend demo-site``: the lab's verbs,
added to the ``metalmend`` command by this distribution's entry point (group
``metalmend.cli``, lab/pyproject.toml), so that metalmend itself never imports the lab.

This module is loaded at every start of ``metalmend``: it imports the lab (and its
dependencies: sushy-tools, bcrypt) inside the commands only. A command's expected failures
(a missing binary, a control plane that did not start, a missing dependency) are one line
and exit code 1, never a traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.cli.client import LabDir

if TYPE_CHECKING:
    from metalmend_lab import lab as lab_

lab_app = typer.Typer(no_args_is_help=True, help="A real local cluster for demos and tests.")
out = Console()
err = Console(stderr=True)

NodeGrace = Annotated[
    float,
    typer.Option("--node-grace", help="Seconds without heartbeats before a Node is Unknown."),
]
# Modules this distribution depends on (lab/pyproject.toml): their absence is one line.
DEPENDENCIES = frozenset({"sushy_tools", "sushy", "bcrypt"})
INSTALL_HINT = "in a checkout of metalmend, run 'pip install ./lab' (make venv does)"


def register(app: typer.Typer) -> None:
    """The entry point: the lab's verbs on ``app``."""
    app.add_typer(lab_app, name="lab")
    app.command()(demo)
    app.command("demo-site")(demo_site)


def fail(message: str, code: int = 1) -> NoReturn:
    err.print(f"[red]metalmend:[/red] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


P = ParamSpec("P")
R = TypeVar("R")


def one_line_errors(command: Callable[P, R]) -> Callable[P, R]:
    """The lab's expected failures as one line on stderr and exit code 1."""

    @functools.wraps(command)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return command(*args, **kwargs)
        except ModuleNotFoundError as error:
            if (error.name or "").partition(".")[0] not in DEPENDENCIES:
                raise
            say(f"the lab and the demos need {error.name}, which is not installed: {INSTALL_HINT}")
        except Exception as error:
            if not isinstance(error, _lab_errors()):
                raise
            say(str(error))
        raise typer.Exit(1)

    return run


def say(message: str) -> None:
    err.print(f"metalmend: {message}", highlight=False, markup=False, soft_wrap=True)


def _lab_errors() -> tuple[type[Exception], ...]:
    """The lab's expected failures (a missing binary, a control plane that did not start).
    Only a lab command can raise them, and it has loaded the lab."""
    if "metalmend_lab.lab" not in sys.modules:
        return ()
    from metalmend_lab import lab as lab_
    from metalmend_lab.assets import AssetsError
    from metalmend_lab.controlplane import ControlPlaneError

    return (AssetsError, ControlPlaneError, lab_.LabError)


# The lab's own default (lab.DEFAULT_CONTROLLERS), written here too so that --help does
# not load the lab; tests/unit/test_import_contract.py checks that they agree.
LAB_CONTROLLERS = (
    "node-link,host-power,machine-health-check,node-health-check,metal3-remediation,"
    "machine-remediation,fence-remediation"
)
LAB_BMO_CONTROLLERS = (  # lab.BMO_CONTROLLERS
    "node-link,machine-health-check,node-health-check,metal3-remediation,fence-remediation"
)
LAB_MACHINE_APIS = ("none", "capi", "capi-metal3", "openshift")  # lab.MACHINE_APIS
LAB_PROVISION_DELAY = 2.0  # provisioner.DEFAULT_DELAY, likewise


@lab_app.command("up")
@one_line_errors
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
        str | None,
        typer.Option(
            help="Controllers 'metalmend run' runs against the lab ('' for none; 'lab status'"
            " lists them). Default: every one; with --power-owner bmo-stand-in not host-power"
            " and machine-remediation; under --machine-api capi or capi-metal3 not"
            " machine-health-check and node-link (Cluster API's manager does both); under"
            " openshift not node-link (OpenShift's nodelink-controller runs)."
        ),
    ] = None,
    machine_api: Annotated[
        str,
        typer.Option(
            help="Whose Machines: none (metalmend's subset of Cluster API's CRDs), capi"
            " (Cluster API's manager, make capi), capi-metal3 (the same, with Metal3Machines"
            " as CAPM3 makes them; needs METALMEND_UPSTREAM_CRDS) or openshift (OpenShift's"
            " machine-healthcheck and nodelink-controller, make openshift).",
        ),
    ] = "none",
    power_owner: Annotated[
        str,
        typer.Option(
            help="Who owns the hosts' power: metalmend (its host-power) or bmo-stand-in (the"
            " lab's stand-in for baremetal-operator, with upstream's BareMetalHost CRD).",
        ),
    ] = "metalmend",
    bmo_refresh: Annotated[
        float,
        typer.Option(
            help="Seconds between the BMO stand-in's power reads (upstream: 60).", min=0.1
        ),
    ] = 60.0,
) -> None:
    """Start the lab: control plane, CRDs, and (with --hosts) BMCs, hosts and kubelets."""
    from metalmend_lab import lab as lab_

    if bmc not in ("redfish", "ipmi", "mixed"):
        fail(f"--bmc must be redfish, ipmi or mixed, not {bmc!r}", code=2)
    if power_owner not in ("metalmend", "bmo-stand-in"):
        fail(f"--power-owner must be metalmend or bmo-stand-in, not {power_owner!r}", code=2)
    if machine_api not in LAB_MACHINE_APIS:
        fail(f"--machine-api must be one of {', '.join(LAB_MACHINE_APIS)}, not {machine_api!r}",
             code=2)  # fmt: skip
    options = lab_.LabOptions(
        lab_dir=lab_dir,
        node_monitor_grace_period=node_grace,
        hosts=hosts,
        bmc=bmc,
        boot_delay=boot_delay,
        erase_seconds=erase_seconds,
        provision_delay=provision_delay,
        controllers=controllers,
        power_owner=power_owner,
        bmo_refresh=bmo_refresh,
        machine_api=machine_api,
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
@one_line_errors
def lab_down(lab_dir: LabDir = Path(".lab")) -> None:
    """Stop the lab and every process it started."""
    from metalmend_lab import lab as lab_

    if lab_.down(lab_dir):
        out.print("lab stopped")
    else:
        out.print(f"no lab is running in {lab_dir}")


@lab_app.command("status")
@one_line_errors
def lab_status(lab_dir: LabDir = Path(".lab")) -> None:
    """Show what the lab runs."""
    from metalmend_lab import lab as lab_

    report = lab_.status(lab_dir)
    if not report.running:
        out.print(f"no lab is running in {lab_dir}")
        raise typer.Exit(1)
    readiness = "[green]ok[/green]" if report.apiserver_ready else "[red]not ready[/red]"
    out.print(f"server {report.server}  readyz {readiness}")
    out.print(f"kubeconfig {report.kubeconfig}")
    from metalmend_lab.servedeploy import ENDPOINTS, Endpoints

    if (endpoints := Endpoints.read(lab_dir)) is not None:
        out.print(f"teardown API {endpoints.url}  ({lab_dir / ENDPOINTS})")
    table = Table("component", "pid", "running", "restarts")
    for c in report.components:
        running = "yes" if c.running else "[red]no[/red]"
        table.add_row(c.name, str(c.pid), running, str(c.restarts))
    out.print(table)
    out.print(f"machine API {report.machine_api}")
    controllers = ", ".join(report.controllers) or "none"
    out.print(f"metalmend run --controllers: {controllers}", soft_wrap=True)
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
@one_line_errors
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
    from metalmend_lab import lab as lab_

    try:
        lab_.inject_fault(lab_dir, host, kind)
    except ValueError as error:
        fail(str(error), code=2)
    out.print(f"{host}: {kind}")


@lab_app.command("design")
@one_line_errors
def lab_design(
    lab_dir: LabDir = Path(".lab"),
    output: Annotated[
        Path | None, typer.Option("--output", help="Write the documents here, not to stdout.")
    ] = None,
) -> None:
    """Print the running lab's site design: documents for the design store's bucket."""
    from metalmend_lab import lab as lab_

    try:
        text = lab_.site_design(lab_dir)
    except lab_.LabError as error:
        fail(str(error))
    if output is None:
        sys.stdout.write(text)
    else:
        output.write_text(text)
        err.print(f"site design written to {output}")


@one_line_errors
def demo(
    lab_dir: LabDir = Path(".lab-demo"),
    keep: Annotated[bool, typer.Option(help="Keep the lab running until Ctrl-C.")] = False,
) -> None:
    """Start the lab and show metalmend working in it."""
    from metalmend_lab.demo import run_demo

    run_demo(lab_dir, out, keep=keep)


@one_line_errors
def demo_site(
    lab_dir: LabDir = Path(".lab-demo"),
    keep: Annotated[bool, typer.Option(help="Keep the lab running until Ctrl-C.")] = False,
) -> None:
    """Start the lab and show site actions: the design deployed, a server redeployed live,
    the intermediate-commit guard."""
    from metalmend_lab.demo_site import run_site_demo

    run_site_demo(lab_dir, out, keep=keep)
