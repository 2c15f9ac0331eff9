"""The one client of ``metalmend serve`` that every ``metalmend`` verb calling it uses
(``node``, ``etcd``, ``design``, ``site``): which service and as whom (``resolve``,
``Target``), the HTTP client (``sync_client``, ``async_client``: TLS, token, timeouts),
the service unreachable as one error (exit 3), a refusal shown as its Status body (exit 1),
and the answer read.

Which service: ``--url`` (and ``--ca`` for a certificate the system does not trust), else
the lab's ``.lab/endpoints.json`` (``--dir``, ``$METALMEND_LAB_DIR``). Who calls: ``--token``,
else the bearer token of the kubeconfig (``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``), except that in the lab, without ``--kubeconfig``, the lab admin's token
of endpoints.json is used (the lab's kubeconfig holds a client certificate, not a token).

This module never imports the lab: it reads endpoints.json as any client would.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape

ENDPOINTS = "endpoints.json"
CONNECT_TIMEOUT = 10.0
YAML = "application/x-yaml"

EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

out = Console()
err = Console(stderr=True)

Url = Annotated[
    str | None,
    typer.Option(help="metalmend serve, e.g. https://teardown.example:8443 (default: the lab's)."),
]
Ca = Annotated[Path | None, typer.Option(help="CA file that signed the service's certificate.")]
Token = Annotated[
    str | None,
    typer.Option(
        help="Bearer token (default: the kubeconfig's, or the lab admin's).",
        envvar="METALMEND_TOKEN",
    ),
]
Kubeconfig = Annotated[Path | None, typer.Option(help="Kubeconfig whose bearer token to send.")]
LabDir = Annotated[
    Path, typer.Option("--dir", help="Lab state directory.", envvar="METALMEND_LAB_DIR")
]


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def fail(error: CliError) -> NoReturn:
    err.print(f"[red]metalmend:[/red] {escape(str(error))}", highlight=False, soft_wrap=True)
    raise typer.Exit(error.code)


# ---- which service, as whom -------------------------------------------------------------


@dataclass(frozen=True)
class Service:
    url: str
    ca: str | None
    token: str
    design_ref: str | None = None


def read_endpoints(lab_dir: Path) -> dict[str, Any] | None:
    """The lab's endpoints.json, or None when there is none (no lab running there)."""
    path = lab_dir / ENDPOINTS
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        raise CliError(f"cannot read {path}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise CliError(f"cannot read {path}: no url in it")
    return data


def kubeconfig_token(kubeconfig: Path | None) -> str:
    """The bearer token of the kubeconfig's current user (``token`` or ``tokenFile``)."""
    from metalmend.kube.client import ClusterUnavailable, load_config

    try:
        current = load_config(kubeconfig).get()
    except ClusterUnavailable as error:
        raise CliError(f"{error}: give --token") from None
    user = current.user if current else None
    if user is not None and user.token:
        return user.token
    if user is not None and user.token_file:
        try:
            return Path(user.token_file).read_text().strip()
        except OSError as error:
            raise CliError(f"cannot read the kubeconfig's token file: {error}") from None
    raise CliError(
        "the kubeconfig's user has no bearer token (a client certificate or an exec plugin"
        " cannot be passed on): give --token"
    )


def resolve(
    url: str | None,
    ca: Path | None,
    token: str | None,
    kubeconfig: Path | None,
    lab_dir: Path,
) -> Service:
    lab = None if url else read_endpoints(lab_dir)
    if url is None and lab is None:
        raise CliError(
            f"which metalmend serve? give --url (and --ca), or start the lab ('metalmend lab"
            f" up'), which writes {lab_dir / ENDPOINTS}"
        )
    if lab is not None:
        url = str(lab["url"])
        ca = ca or (Path(lab["ca"]) if lab.get("ca") else None)
    assert url is not None
    if token is None:
        if lab is not None and kubeconfig is None and lab.get("token"):
            token = str(lab["token"])
        else:
            token = kubeconfig_token(kubeconfig)
    design_ref = str(lab["design_ref"]) if lab is not None and lab.get("design_ref") else None
    return Service(url.rstrip("/"), str(ca) if ca else None, token, design_ref)


# ---- the HTTP client ---------------------------------------------------------------------


def _client_options(
    service: Service, timeout: float | None, headers: dict[str, str] | None
) -> dict[str, Any]:
    return {
        "verify": ssl.create_default_context(cafile=service.ca) if service.ca else True,
        "timeout": httpx.Timeout(timeout, connect=CONNECT_TIMEOUT),
        "headers": {"Authorization": f"Bearer {service.token}", **(headers or {})},
    }


def sync_client(
    service: Service, timeout: float | None, headers: dict[str, str] | None = None
) -> httpx.Client:
    """A client of ``service``: its CA, the caller's token, ``timeout`` seconds for an
    answer (None: as long as the step takes), CONNECT_TIMEOUT to connect."""
    return httpx.Client(**_client_options(service, timeout, headers))


def async_client(
    service: Service, timeout: float | None, headers: dict[str, str] | None = None
) -> httpx.AsyncClient:
    """``sync_client``'s asynchronous twin (for progress lines while a step runs)."""
    return httpx.AsyncClient(**_client_options(service, timeout, headers))


def unreachable(service: Service, error: httpx.HTTPError) -> CliError:
    """The service could not be reached, or did not answer: exit 3."""
    if isinstance(error, httpx.ConnectError):
        return CliError(
            f"cannot reach metalmend serve at {service.url}: {first_line(error)}", EXIT_UNREACHABLE
        )
    return CliError(
        f"metalmend serve at {service.url} did not answer: {first_line(error)}", EXIT_UNREACHABLE
    )


# ---- the answer ---------------------------------------------------------------------------


def first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def messages(document: dict[str, Any]) -> list[dict[str, Any]]:
    details = document.get("details") or {}
    found = details.get("messageList") if isinstance(details, dict) else None
    return [m for m in found or [] if isinstance(m, dict)]


def show_status(document: dict[str, Any]) -> None:
    """A success: its message and what was done; a failure: Shipyard's Error/Reason lines."""
    message = escape(str(document.get("message", "")))
    if document.get("status") == "Success":
        out.print(f"[green]{message}[/green]", highlight=False)
    else:
        out.print(f"[red]Error:[/red] {message}", highlight=False)
        out.print(f"Reason: {escape(str(document.get('reason', '')))}", highlight=False)
    for entry in messages(document):
        label = "[red]- Error:[/red]" if entry.get("error") else "- Info:"
        out.print(f"{label} {escape(str(entry.get('message', '')))}", highlight=False)


# ---- design and site: one request, its refusal, the answer ------------------------------


@dataclass(frozen=True)
class Target:
    url: str | None
    ca: Path | None
    token: str | None
    kubeconfig: Path | None
    lab_dir: Path

    def service(self) -> Service:
        return resolve(self.url, self.ca, self.token, self.kubeconfig, self.lab_dir)


def request(
    target: Target,
    method: str,
    path: str,
    *,
    body: str | None = None,
    json: Any = None,
    params: Any = None,
    timeout: float = 300.0,
) -> httpx.Response:
    """One request to ``path`` (the API's prefix included); a refusal printed as its
    Status body and exit 1; the service unreachable: exit 3."""
    service = target.service()
    headers = {"Accept": YAML}
    if body is not None:
        headers["Content-Type"] = YAML
    try:
        with sync_client(service, timeout, headers) as http:
            answer = http.request(
                method, service.url + path, content=body, json=json, params=params
            )
    except httpx.HTTPError as error:
        raise unreachable(service, error) from None
    if answer.status_code >= 400:
        refused(answer, service.url)
    return answer


def refused(answer: httpx.Response, url: str) -> None:
    try:
        document = yaml.safe_load(answer.text)  # a Status body: YAML, or JSON (YAML too)
    except yaml.YAMLError:
        document = None
    if not isinstance(document, dict) or "status" not in document:
        raise CliError(
            f"{url} answered HTTP {answer.status_code} without a Status body:"
            " is it metalmend serve?",
            EXIT_FAILURE,
        )
    show_status(document)
    raise typer.Exit(EXIT_FAILURE)


def parsed(answer: httpx.Response, many: bool = False) -> Any:
    try:
        return list(yaml.safe_load_all(answer.text)) if many else yaml.safe_load(answer.text)
    except yaml.YAMLError:
        raise CliError("metalmend serve answered YAML that cannot be read", EXIT_FAILURE) from None


def run_command(target: Target, command: Callable[[], None]) -> None:
    try:
        command()
    except CliError as error:
        fail(error)
