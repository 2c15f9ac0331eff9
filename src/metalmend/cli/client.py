"""Calling ``metalmend serve`` from the CLI: which service and as whom (``Target``), one
request with its refusal shown as the Status body, and the answer read.

Shared by ``metalmend design`` (Deckhand's API) and ``metalmend site`` (Shipyard's); which
service and token exactly as ``metalmend node`` resolves them (``cli_node.resolve``).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import typer
import yaml

from metalmend.cli_node import (
    CONNECT_TIMEOUT,
    EXIT_FAILURE,
    EXIT_UNREACHABLE,
    CliError,
    Service,
    fail,
    resolve,
    show_status,
)

YAML = "application/x-yaml"


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
    verify = ssl.create_default_context(cafile=service.ca) if service.ca else True
    headers = {"Authorization": f"Bearer {service.token}", "Accept": YAML}
    if body is not None:
        headers["Content-Type"] = YAML
    limits = httpx.Timeout(timeout, connect=CONNECT_TIMEOUT)
    try:
        with httpx.Client(verify=verify, timeout=limits, headers=headers) as http:
            answer = http.request(
                method, service.url + path, content=body, json=json, params=params
            )
    except httpx.ConnectError as error:
        raise CliError(
            f"cannot reach metalmend serve at {service.url}: {error}", EXIT_UNREACHABLE
        ) from None
    except httpx.HTTPError as error:
        raise CliError(
            f"metalmend serve at {service.url} did not answer: {error}", EXIT_UNREACHABLE
        ) from None
    if answer.status_code >= 400:
        refused(answer, service.url)
    return answer


def refused(answer: httpx.Response, url: str) -> None:
    try:
        document = yaml.safe_load(answer.text)  # a Status body: JSON, which is YAML
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
