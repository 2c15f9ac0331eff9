"""``metalmend design put|revisions|documents|tag|diff``: the design revisions of
``metalmend serve`` (docs/design-store.md, Deckhand's API) from a shell.

Which service and as whom exactly as ``metalmend node`` (``metalmend.cli.client``):
``--url``/``--ca``, else the lab's ``.lab/endpoints.json``; ``--token``, else the
kubeconfig's bearer token, or the lab admin's in the lab. Tables for people, ``--yaml``
for the documents as the service answered them. A refusal prints the Status body
(``Error:`` / ``Reason:`` / ``- Error:`` lines). Exit codes as ``metalmend node``: 0
success, 1 the service refused, 2 usage, 3 unreachable.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import typer
import yaml
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.cli.client import (
    Ca,
    CliError,
    Kubeconfig,
    LabDir,
    Target,
    Token,
    Url,
    parsed,
    run_command,
)
from metalmend.cli.client import request as service_request

DECKHAND = "/deckhand/api/v1.0"
YAML = "application/x-yaml"
CREATED_HEADER = "X-Revision-Created"  # "true" or "false": did this put make a revision

design_app = typer.Typer(
    no_args_is_help=True,
    help="Site design documents and their revisions, through 'metalmend serve' (Deckhand's API).",
)
out = Console()


def request(
    target: Target, method: str, path: str, *, body: str | None = None, params: Any = None
) -> httpx.Response:
    """One request to Deckhand's API; a refusal printed as its Status body and exit 1."""
    return service_request(target, method, DECKHAND + path, body=body, params=params)


def revision_path(revision: int) -> str:
    return f"/revisions/{revision}"


# ---- the commands -----------------------------------------------------------------------

Revision = Annotated[int, typer.Argument(min=0, help="Revision number (0: the empty revision).")]
Yaml = Annotated[bool, typer.Option("--yaml", help="Print the service's YAML answer as it is.")]
TagFilter = Annotated[
    list[str] | None,
    typer.Option(help="Only revisions with this tag (repeat: any of them, as Deckhand)."),
]
SchemaFilter = Annotated[
    str | None, typer.Option(help="Schema prefix by whole segment: promenade, promenade/Node.")
]
LabelFilter = Annotated[list[str] | None, typer.Option(help="key=value (repeat: all of them).")]
BucketFilter = Annotated[
    list[str] | None, typer.Option(help="Only this bucket (repeat: any of them).")
]
Rendered = Annotated[bool, typer.Option(help="The rendered documents (abstract ones left out).")]
TagData = Annotated[list[str] | None, typer.Option(help="key=value for the tag's data (repeat).")]


@design_app.command("put")
def put(
    bucket: Annotated[str, typer.Argument(help="The bucket whose documents these become.")],
    file: Annotated[Path, typer.Argument(help="Multi-document YAML file ('-': standard input).")],
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Make FILE's documents the bucket's contents (documents left out are deleted): a new
    revision if anything changed."""

    def command() -> None:
        try:
            text = sys.stdin.read() if str(file) == "-" else file.read_text()
        except (OSError, UnicodeDecodeError) as error:
            raise CliError(f"cannot read {file}: {error}") from None
        target = Target(url, ca, token, kubeconfig, lab_dir)
        answer = request(target, "PUT", f"/buckets/{quote(bucket, safe='')}/documents", body=text)
        documents = [d for d in parsed(answer, many=True) if isinstance(d, dict) and "schema" in d]
        revisions = [
            d.get("status", {}).get("revision")
            for d in parsed(answer, many=True)
            if isinstance(d, dict)
        ]
        revision = max((r for r in revisions if isinstance(r, int)), default=0)
        if answer.headers.get(CREATED_HEADER) == "false":
            out.print(
                f"bucket {escape(bucket)} unchanged: {len(documents)} document(s),"
                f" newest revision {revision}",
                highlight=False,
            )
        else:
            out.print(
                f"[green]revision {revision}[/green]: bucket {escape(bucket)} holds"
                f" {len(documents)} document(s)",
                highlight=False,
            )

    run_command(Target(url, ca, token, kubeconfig, lab_dir), command)


@design_app.command("revisions")
def revisions(
    tag: TagFilter = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """The revisions, oldest first, with their tags and buckets."""

    def command() -> None:
        target = Target(url, ca, token, kubeconfig, lab_dir)
        body = parsed(request(target, "GET", "/revisions", params=[("tag", t) for t in tag or []]))
        table = Table("Revision", "Created", "Tags", "Buckets")
        for entry in body.get("results", []) if isinstance(body, dict) else []:
            table.add_row(
                str(entry.get("id")), escape(str(entry.get("createdAt", ""))),
                escape(", ".join(entry.get("tags", []))),
                escape(", ".join(entry.get("buckets", []))),
            )  # fmt: skip
        out.print(table)
        out.print(
            f"{body.get('count', 0) if isinstance(body, dict) else 0} revision(s)", highlight=False
        )

    run_command(Target(url, ca, token, kubeconfig, lab_dir), command)


@design_app.command("documents")
def documents(
    revision: Revision,
    schema: SchemaFilter = None,
    name: Annotated[str | None, typer.Option(help="metadata.name.")] = None,
    label: LabelFilter = None,
    bucket: BucketFilter = None,
    rendered: Rendered = False,
    as_yaml: Yaml = False,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """The documents of a revision: a table, or YAML with --yaml."""

    def command() -> None:
        params: list[tuple[str, str]] = [("schema", schema)] if schema else []
        params += [("metadata.name", name)] if name else []
        params += [("metadata.label", x) for x in label or []]
        params += [("status.bucket", x) for x in bucket or []]
        kind = "rendered-documents" if rendered else "documents"
        target = Target(url, ca, token, kubeconfig, lab_dir)
        answer = request(target, "GET", f"{revision_path(revision)}/{kind}", params=params)
        if as_yaml:
            sys.stdout.write(answer.text)
            return
        table = Table("Bucket", "Schema", "Name", "Changed in")
        found = [d for d in parsed(answer, many=True) if isinstance(d, dict) and "schema" in d]
        for d in found:
            status, metadata = d.get("status") or {}, d.get("metadata") or {}
            table.add_row(
                escape(str(status.get("bucket", ""))), escape(str(d["schema"])),
                escape(str(metadata.get("name", ""))), str(status.get("revision", "")),
            )  # fmt: skip
        out.print(table)
        out.print(f"{len(found)} document(s) in revision {revision}", highlight=False)

    run_command(Target(url, ca, token, kubeconfig, lab_dir), command)


def tag_body(data: list[str]) -> dict[str, str]:
    body: dict[str, str] = {}
    for item in data:
        key, equals, value = item.partition("=")
        if not equals or not key:
            raise CliError(f"--data {item!r} is not key=value")
        body[key] = value
    return body


@design_app.command("tag")
def tag(
    revision: Revision,
    name: Annotated[str, typer.Argument(help="The tag (letters, digits, - _ .).")],
    data: TagData = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Tag a revision (again: its data is replaced)."""

    def command() -> None:
        body = yaml.safe_dump(tag_body(data or [])) if data else ""
        target = Target(url, ca, token, kubeconfig, lab_dir)
        answer = request(
            target, "POST", f"{revision_path(revision)}/tags/{quote(name, safe='')}", body=body
        )
        stored = parsed(answer)
        shown = stored.get(name) if isinstance(stored, dict) else None
        suffix = f" with {escape(str(shown))}" if shown else ""
        out.print(
            f"[green]revision {revision} tagged {escape(name)}[/green]{suffix}", highlight=False
        )

    run_command(Target(url, ca, token, kubeconfig, lab_dir), command)


@design_app.command("diff")
def diff(
    first: Revision,
    second: Revision,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Per bucket, from the older revision to the newer: created, deleted, modified or
    unmodified."""

    def command() -> None:
        target = Target(url, ca, token, kubeconfig, lab_dir)
        changes = parsed(request(target, "GET", f"{revision_path(first)}/diff/{second}")) or {}
        older, newer = sorted((first, second))
        table = Table("Bucket", f"Revision {older} → {newer}")
        colours = {"created": "green", "deleted": "red", "modified": "yellow"}
        for bucket, change in changes.items() if isinstance(changes, dict) else []:
            colour = colours.get(str(change))
            shown = f"[{colour}]{escape(str(change))}[/{colour}]" if colour else escape(str(change))
            table.add_row(escape(str(bucket)), shown)
        out.print(table)

    run_command(Target(url, ca, token, kubeconfig, lab_dir), command)
