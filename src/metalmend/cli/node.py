"""``metalmend node drain|clear-labels|remove-etcd|shutdown-kubelet|remove-from-cluster|
decommission NODE`` and ``metalmend etcd health``: the node-teardown API of ``metalmend
serve`` (docs/teardown.md) from a shell.

Which service and as whom (``--url``/``--ca``, else the lab's endpoints.json; ``--token``,
else the kubeconfig's), and the HTTP client: ``metalmend.cli.client``.

Requests are synchronous and a step may take long (a drain: up to its timeout): progress
is printed to stderr while it runs; the Status body is printed at the end, as Airship's
Shipyard CLI prints one (``Error:`` / ``Reason:`` / ``- Error:`` lines). Exit codes: 0
success; 1 the service answered a failure; 2 a usage or configuration problem; 3 the
service cannot be reached.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
from rich.console import Console
from rich.markup import escape

from metalmend.cli.client import (
    EXIT_FAILURE,
    Ca,
    CliError,
    Kubeconfig,
    LabDir,
    Service,
    Token,
    Url,
    async_client,
    fail,
    messages,
    resolve,
    show_status,
    sync_client,
    unreachable,
)

PROMENADE = "/promenade/api/v1.0"
PROGRESS_EVERY = 10.0  # seconds between "still running" lines when stderr is no terminal

node_app = typer.Typer(
    no_args_is_help=True,
    help="Tear a Node down through 'metalmend serve' (Airship's Promenade node API).",
)
etcd_app = typer.Typer(
    no_args_is_help=True, help="The site's etcd clusters, through 'metalmend serve'."
)
out = Console()
err = Console(stderr=True)

NO_DESIGN_REF = "give --design-ref: the design reference that locates the etcd clusters"


# ---- one request, with progress ---------------------------------------------------------


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    doing: str  # "draining worker-0", for progress lines
    params: dict[str, str]
    body: dict[str, Any] | None = None


def query(**values: int | str | None) -> dict[str, str]:
    """Only the parameters given: the service applies its own defaults to the others."""
    return {name.replace("_", "-"): str(v) for name, v in values.items() if v is not None}


def design_body(href: str) -> dict[str, str]:
    return {"rel": "design", "href": href, "type": "application/x-yaml"}


async def send(service: Service, request: Request) -> httpx.Response:
    async with async_client(service, timeout=None) as http:  # a step takes its own time
        return await http.request(
            request.method, service.url + request.path, params=request.params, json=request.body
        )


async def with_progress(service: Service, request: Request) -> httpx.Response:
    started = time.monotonic()
    task = asyncio.ensure_future(send(service, request))
    if err.is_terminal:
        with err.status(f"{request.doing} ..."):
            return await task
    err.print(f"{request.doing} ({service.url})", highlight=False)
    while True:
        done, _ = await asyncio.wait({task}, timeout=PROGRESS_EVERY)
        if done:
            return task.result()
        err.print(f"  still {request.doing}: {time.monotonic() - started:.0f} s", highlight=False)


def call(service: Service, request: Request, show: Callable[[dict[str, Any]], None]) -> int:
    """Send ``request``; print its Status; the exit code."""
    try:
        answer = asyncio.run(with_progress(service, request))
    except httpx.HTTPError as error:
        raise unreachable(service, error) from None
    try:
        document = answer.json()
    except ValueError:
        document = None
    if not isinstance(document, dict) or "status" not in document:
        raise CliError(
            f"{service.url} answered HTTP {answer.status_code} without a Status body: is it"
            " metalmend serve?",
            EXIT_FAILURE,
        )
    show(document)
    return 0 if answer.status_code < 400 else EXIT_FAILURE


def show_health(document: dict[str, Any]) -> None:
    """The etcd health answer: one line per cluster (its HealthMessage)."""
    if document.get("status") != "Success":
        show_status(document)
        return
    for entry in messages(document):
        name = escape(str(entry.get("name", "?")))
        health = escape(str(entry.get("message", "")))
        colour = "green" if health == "Healthy" else "red"
        detail = f" ({escape(str(entry['detail']))})" if entry.get("detail") else ""
        out.print(f"{name}: [{colour}]{health}[/{colour}]{detail}", highlight=False)


# ---- the commands -----------------------------------------------------------------------

NodeName = Annotated[str, typer.Argument(help="The Node (the server's hostname).")]
Seconds = Annotated[int | None, typer.Option(min=0, help="Whole seconds (default: the service's).")]
DesignRef = Annotated[
    str | None,
    typer.Option(help="Design reference URL, deckhand+https://... (default: the lab's)."),
]


def run(
    request: Request,
    url: str | None,
    ca: Path | None,
    token: str | None,
    kubeconfig: Path | None,
    lab_dir: Path,
    show: Callable[[dict[str, Any]], None] = show_status,
    needs_design: bool = False,
) -> None:
    try:
        service = resolve(url, ca, token, kubeconfig, lab_dir)
        if needs_design and request.body is None:
            if service.design_ref is None:
                raise CliError(NO_DESIGN_REF)
            request = Request(
                request.method, request.path, request.doing, request.params,
                design_body(service.design_ref),
            )  # fmt: skip
        code = call(service, request, show)
    except CliError as error:
        fail(error)
    raise typer.Exit(code)


def _node_path(node: str, step: str) -> str:
    return f"{PROMENADE}/nodes/{quote(node, safe='')}/{step}"


@node_app.command("drain")
def drain(
    node: NodeName,
    timeout: Seconds = None,
    grace_period: Seconds = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Cordon the Node and evict its pods (kubectl drain --force --ignore-daemonsets
    --delete-emptydir-data, budgets respected). Defaults: timeout 3600, grace period 1800."""
    params = query(timeout=timeout, grace_period=grace_period)
    request = Request("POST", _node_path(node, "drain"), f"draining {node}", params)
    run(request, url, ca, token, kubeconfig, lab_dir)


@node_app.command("clear-labels")
def clear_labels(
    node: NodeName,
    timeout: Seconds = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Remove the Node's labels, then wait for the pods that needed them to settle."""
    params = query(timeout=timeout)
    request = Request("POST", _node_path(node, "clear-labels"), f"clearing {node}'s labels", params)
    run(request, url, ca, token, kubeconfig, lab_dir)


@node_app.command("remove-etcd")
def remove_etcd(
    node: NodeName,
    design_ref: DesignRef = None,
    timeout: Seconds = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Take the Node's etcd members out of their clusters, never below quorum."""
    body = design_body(design_ref) if design_ref else None
    request = Request(
        "POST", _node_path(node, "remove-etcd"), f"removing {node}'s etcd members",
        query(timeout=timeout), body,
    )  # fmt: skip
    run(request, url, ca, token, kubeconfig, lab_dir, needs_design=True)


@node_app.command("shutdown-kubelet")
def shutdown_kubelet(
    node: NodeName,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Label the Node promenade-decomission=enabled and wait until its kubelet stopped."""
    request = Request(
        "POST", _node_path(node, "shutdown-kubelet"), f"shutting {node}'s kubelet down", {}
    )
    run(request, url, ca, token, kubeconfig, lab_dir)


@node_app.command("remove-from-cluster")
def remove_from_cluster(
    node: NodeName,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Delete the Node, once it is cordoned, drained and unlabelled."""
    request = Request(
        "POST", _node_path(node, "remove-from-cluster"), f"removing {node} from the cluster", {}
    )
    run(request, url, ca, token, kubeconfig, lab_dir)


@node_app.command("decommission")
def decommission(
    node: NodeName,
    design_ref: DesignRef = None,
    drain_node_timeout: Seconds = None,
    drain_node_grace_period: Seconds = None,
    clear_labels_timeout: Seconds = None,
    remove_etcd_timeout: Seconds = None,
    etcd_ready_timeout: Seconds = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Drain, clear labels, remove etcd members, wait for etcd, shut the kubelet down."""
    params = query(
        drain_node_timeout=drain_node_timeout, drain_node_grace_period=drain_node_grace_period,
        clear_labels_timeout=clear_labels_timeout, remove_etcd_timeout=remove_etcd_timeout,
        etcd_ready_timeout=etcd_ready_timeout,
    )  # fmt: skip
    body = design_body(design_ref) if design_ref else None
    request = Request(
        "POST", _node_path(node, "decommission"), f"decommissioning {node}", params, body
    )
    run(request, url, ca, token, kubeconfig, lab_dir, needs_design=True)


@etcd_app.command("health")
def etcd_health(
    design_ref: DesignRef = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Healthy or Unhealthy, per etcd cluster of the design."""
    try:
        service = resolve(url, ca, token, kubeconfig, lab_dir)
    except CliError as error:
        fail(error)
    reference = design_ref or service.design_ref
    if reference is None:
        fail(CliError(NO_DESIGN_REF))
    request = Request(
        "GET", f"{PROMENADE}/etcd-cluster-health-statuses", "asking etcd health",
        {"design_ref": reference},
    )  # fmt: skip
    run(request, url, ca, token, kubeconfig, lab_dir, show=show_health)


# ---- destroy: Drydock's destroy_nodes task, followed to its end -------------------------

DRYDOCK = "/drydock/api/v1.0"
POLL_SECONDS = 1.0
NO_DESIGN_REF_DESTROY = "give --design-ref: the design reference of the site (Drydock's design_ref)"


def destroy_body(node: str, design_ref: str, preserve: bool) -> dict[str, Any]:
    return {
        "action": "destroy_nodes",
        "design_ref": design_ref,
        "node_filter": {"filter_set_type": "union",
                        "filter_set": [{"filter_type": "union", "node_names": [node]}]},
        "preserve-local-storage": preserve,
    }  # fmt: skip


def _document(answer: httpx.Response, service: Service) -> dict[str, Any]:
    try:
        document = answer.json()
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise CliError(
            f"{service.url} answered HTTP {answer.status_code} without a task or Status body:"
            " is it metalmend serve?",
            EXIT_FAILURE,
        )
    return document


def follow_task(service: Service, http: httpx.Client, task: dict[str, Any]) -> dict[str, Any]:
    """Print each new message of the task as it comes (stderr); the task once complete."""
    path = f"{DRYDOCK}/tasks/{quote(str(task['task_id']), safe='')}"
    shown = 0
    while True:
        entries = messages(task.get("result") or {})
        for entry in entries[shown:]:
            where = escape(str(entry.get("context", "")))
            line = escape(str(entry.get("message", "")))
            colour = "red" if entry.get("error") else "cyan"
            err.print(f"[{colour}]{where}[/{colour}]: {line}", highlight=False, soft_wrap=True)
        shown = len(entries)
        if task.get("status") == "complete":
            return task
        time.sleep(POLL_SECONDS)
        answer = http.get(service.url + path)
        document = _document(answer, service)
        if answer.status_code >= 400:
            show_status(document)
            raise typer.Exit(EXIT_FAILURE)
        task = document


def show_task(task: dict[str, Any]) -> int:
    """The task's result as Shipyard prints a Status; the exit code (0: success)."""
    result = task.get("result") or {}
    status = str(result.get("status", ""))
    message = escape(str(result.get("message", "")))
    if status == "success":
        out.print(f"[green]Task {task.get('task_id')} success: {message}[/green]", highlight=False)
        return 0
    out.print(f"[red]Error:[/red] task {task.get('task_id')} {status}: {message}", highlight=False)
    out.print(f"Reason: {escape(status)}", highlight=False)
    for entry in messages(result):
        if entry.get("error"):
            where = escape(str(entry.get("context", "")))
            out.print(f"[red]- Error:[/red] {where}: {escape(str(entry.get('message', '')))}")
    return EXIT_FAILURE


def destroy_node(service: Service, node: str, design_ref: str, preserve: bool) -> int:
    body = destroy_body(node, design_ref, preserve)
    try:
        with sync_client(service, timeout=60.0) as http:
            answer = http.post(service.url + f"{DRYDOCK}/tasks", json=body)
            document = _document(answer, service)
            if answer.status_code != 201:
                show_status(document)
                return EXIT_FAILURE
            wipe = "the OS drive" if preserve else "every local drive"
            err.print(
                f"destroying {node} (power off, wipe {wipe}, release): task"
                f" {document.get('task_id')} ({service.url})",
                highlight=False,
            )
            try:
                return show_task(follow_task(service, http, document))
            except KeyboardInterrupt:
                err.print(
                    f"stopped following; the task goes on in metalmend serve: GET"
                    f" {service.url}{DRYDOCK}/tasks/{document.get('task_id')}",
                    highlight=False,
                )
                return EXIT_FAILURE
    except httpx.HTTPError as error:
        raise unreachable(service, error) from None


@node_app.command("destroy")
def destroy(
    node: NodeName,
    preserve_local_storage: Annotated[
        bool,
        typer.Option(
            "--preserve-local-storage",
            help="Erase only the OS drive (chosen by the host's spec.rootDeviceHints); keep"
            " every other drive as it is.",
        ),
    ] = False,
    design_ref: DesignRef = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Destroy the Node's server (Drydock's destroy_nodes): power it off through its
    BareMetalHost, securely erase every local drive (or only the OS drive), release the
    host. Follows the task to its end; exit 0 only when the node was destroyed."""
    try:
        service = resolve(url, ca, token, kubeconfig, lab_dir)
        reference = design_ref or service.design_ref
        if reference is None:
            raise CliError(NO_DESIGN_REF_DESTROY)
        code = destroy_node(service, node, reference, preserve_local_storage)
    except CliError as error:
        fail(error)
    raise typer.Exit(code)
