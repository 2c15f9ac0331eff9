"""``metalmend site ...``: Shipyard's CLI verbs over ``metalmend serve``'s Shipyard API
(docs/site-actions.md; Shipyard's CLI reference, https://airship-shipyard.readthedocs.io,
"Shipyard CLI"):

    metalmend site create configdocs COLLECTION --filename F [--append|--replace]
    metalmend site commit configdocs [--force] [--dryrun]
    metalmend site get configdocs [--collection C] [-b|--buffer|-c|--committed|
                                  -l|--last-site-action|-s|--successful-site-action]
    metalmend site get configdocs --base-version committed --diff-version buffer
    metalmend site get renderedconfigdocs [-c|--committed ...]
    metalmend site create action NAME --param k=v ... [--allow-intermediate-commits] [--watch]
    metalmend site get actions
    metalmend site describe action/ID [--watch]  (or: action ID)
    metalmend site describe step/ID/STEP          (or: step STEP --action ID)
    metalmend site stop action/ID                 (or: action ID)

Which service and as whom exactly as ``metalmend node``. A refusal prints Shipyard's
``Error:`` / ``Reason:`` / ``- Error:`` lines and exits 1; usage errors exit 2; the
service unreachable exits 3. ``--watch`` follows the action live, one line per note with
its time, and exits 0 only when the action completed.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from metalmend.cli.client import (
    EXIT_FAILURE,
    Ca,
    CliError,
    Kubeconfig,
    LabDir,
    Target,
    Token,
    Url,
    parsed,
    request,
    run_command,
)

SHIPYARD = "/shipyard/api/v1.0"
VERSIONS = ("buffer", "committed", "last_site_action", "successful_site_action")
WATCH_SECONDS = 1.0

site_app = typer.Typer(
    no_args_is_help=True,
    help="Configdocs and site actions through 'metalmend serve' (Shipyard's API and verbs).",
)
create_app = typer.Typer(no_args_is_help=True, help="Create configdocs or an action.")
commit_app = typer.Typer(no_args_is_help=True, help="Commit the configdocs buffer.")
get_app = typer.Typer(no_args_is_help=True, help="Get configdocs, rendered configdocs, actions.")
site_app.add_typer(create_app, name="create")
site_app.add_typer(commit_app, name="commit")
site_app.add_typer(get_app, name="get")
out = Console()

Buffer = Annotated[bool, typer.Option("--buffer", "-b", help="The buffer version.")]
Committed = Annotated[bool, typer.Option("--committed", "-c", help="The committed version.")]
LastSiteAction = Annotated[
    bool, typer.Option("--last-site-action", "-l", help="The version of the last site action.")
]
SuccessfulSiteAction = Annotated[
    bool,
    typer.Option("--successful-site-action", "-s", help="The version of the last successful one."),
]
# Each version flag as Shipyard's CLI spells it, both forms: what a message names.
FLAG_NAMES = {
    "buffer": "-b/--buffer",
    "committed": "-c/--committed",
    "last_site_action": "-l/--last-site-action",
    "successful_site_action": "-s/--successful-site-action",
}
Watch = Annotated[bool, typer.Option("--watch", help="Follow the action live until it ends.")]


def chosen(buffer: bool, committed: bool, last: bool, successful: bool) -> list[str]:
    """The version flags given, in Shipyard's names."""
    flags = zip(VERSIONS, (buffer, committed, last, successful), strict=True)
    return [name for name, given in flags if given]


def flags_named(flags: list[str]) -> str:
    """The flags given, as the caller may have typed them (``-c/--committed``)."""
    return ", ".join(FLAG_NAMES[f] for f in flags)


def version_name(raw: str) -> str:
    name = raw.strip().lower().replace("-", "_")
    if name not in VERSIONS:
        raise CliError(f"{raw!r} is not a version: {', '.join(VERSIONS)}")
    return name


def action_id(raw: str) -> str:
    """``ID`` or Shipyard's ``action/ID``."""
    return raw.split("/", 1)[1] if raw.startswith("action/") else raw


def named_item(item: str, name: str | None, action_option: str | None) -> tuple[str, str, str]:
    """Shipyard's ways of naming what to describe or stop: ``action/ID``, ``action ID``,
    ``step/ID/STEP``, ``step STEP --action ID`` (``-a``). (kind, action id, step or "")."""
    kind, _, rest = item.partition("/")
    if kind not in ("action", "step"):
        raise CliError(
            f"{item!r}: name an action (action/ID, or action ID) or a step (step/ID/STEP, or"
            " step STEP --action ID)"
        )
    if kind == "action":
        if action_option is not None:
            raise CliError("--action (-a) names a step's action: describe action/ID takes none")
        found = rest or (name or "")
        if rest and name:
            raise CliError(f"{item!r} names the action already: drop {name!r}")
        if not found:
            raise CliError("which action? give action/ID (or action ID)")
        return "action", action_id(found), ""
    if rest:  # step/ID/STEP
        found_id, _, step = rest.partition("/")
        if not found_id or not step or name or action_option:
            raise CliError(f"{item!r}: give step/ID/STEP alone (or step STEP --action ID)")
        return "step", found_id, step
    if not name or not action_option:
        raise CliError("which step? give step/ID/STEP, or step STEP --action ID (-a ID)")
    return "step", action_id(action_option), name


# ---- configdocs -----------------------------------------------------------------------------


@create_app.command("configdocs")
def create_configdocs(
    collection: Annotated[str, typer.Argument(help="The collection (the design store's bucket).")],
    filename: Annotated[
        list[Path] | None, typer.Option(help="A multi-document YAML file ('-': stdin); repeat.")
    ] = None,
    directory: Annotated[Path | None, typer.Option(help="Every *.yaml file in it.")] = None,
    append: Annotated[bool, typer.Option(help="Add to the changes in the buffer.")] = False,
    replace: Annotated[bool, typer.Option(help="Discard the buffer's changes first.")] = False,
    empty_collection: Annotated[
        bool, typer.Option(help="Delete the collection (no files).")
    ] = False,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Put a collection's documents into the buffer."""
    target = Target(url, ca, token, kubeconfig, lab_dir)

    def command() -> None:
        if append and replace:
            raise CliError("--append and --replace are mutually exclusive")
        text = read_documents(filename or [], directory)
        if not text.strip() and not empty_collection:
            raise CliError("no documents: give --filename or --directory (or --empty-collection)")
        mode = "append" if append else "replace" if replace else "rejectoncontents"
        params = {"buffermode": mode}
        if empty_collection:
            params["empty-collection"] = "true"
        path = f"{SHIPYARD}/configdocs/{quote(collection, safe='')}"
        show_status_answer(parsed(request(target, "POST", path, body=text, params=params)))

    run_command(target, command)


def read_documents(files: list[Path], directory: Path | None) -> str:
    paths = list(files)
    if directory is not None:
        if not directory.is_dir():
            raise CliError(f"{directory} is not a directory")
        paths += sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml"))
    texts = []
    for path in paths:
        try:
            texts.append(sys.stdin.read() if str(path) == "-" else path.read_text())
        except (OSError, UnicodeDecodeError) as error:
            raise CliError(f"cannot read {path}: {error}") from None
    return "\n---\n".join(t.strip().removeprefix("---").strip() for t in texts if t.strip())


def show_status_answer(document: Any) -> None:
    """A Status of success: its message, then its messages (validation findings)."""
    if not isinstance(document, dict):
        return
    out.print(f"[green]{escape(str(document.get('message', '')))}[/green]", highlight=False)
    for line in (document.get("details") or {}).get("messageList") or []:
        mark = "[red]- Error:[/red]" if line.get("error") else "- Info:"
        out.print(f"{mark} {escape(str(line.get('message', '')))}", highlight=False)


@commit_app.command("configdocs")
def commit_configdocs(
    force: Annotated[bool, typer.Option(help="Commit even if validation fails.")] = False,
    dryrun: Annotated[bool, typer.Option(help="Only validate.")] = False,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Validate the buffer and commit it (a new committed version)."""
    target = Target(url, ca, token, kubeconfig, lab_dir)

    def command() -> None:
        params = {"force": str(force).lower(), "dryrun": str(dryrun).lower()}
        show_status_answer(
            parsed(request(target, "POST", f"{SHIPYARD}/commitconfigdocs", params=params))
        )

    run_command(target, command)


@get_app.command("configdocs")
def get_configdocs(
    positional: Annotated[
        str | None,
        typer.Argument(
            metavar="[COLLECTION]", help="One collection's documents (as --collection)."
        ),
    ] = None,
    collection_option: Annotated[
        str | None,
        typer.Option("--collection", help="One collection's documents (Shipyard's option)."),
    ] = None,
    buffer: Buffer = False, committed: Committed = False, last_site_action: LastSiteAction = False,
    successful_site_action: SuccessfulSiteAction = False,
    base_version: Annotated[str | None, typer.Option(help="Compare from this version.")] = None,
    diff_version: Annotated[str | None, typer.Option(help="Compare to this version.")] = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """A collection's documents at a version (one version flag, default buffer), or,
    without COLLECTION, each collection compared between two versions (two flags, or
    --base-version/--diff-version; default committed and buffer)."""
    target = Target(url, ca, token, kubeconfig, lab_dir)
    flags = chosen(buffer, committed, last_site_action, successful_site_action)

    def command() -> None:
        if positional is not None and collection_option is not None:
            raise CliError(
                f"the collection is given twice (COLLECTION {positional!r} and --collection"
                f" {collection_option!r}): give one"
            )
        collection = collection_option if collection_option is not None else positional
        named = "--collection" if collection_option is not None else "COLLECTION"
        if collection is not None:
            if base_version or diff_version:
                given = "--base-version" if base_version else "--diff-version"
                raise CliError(f"{given} compares every collection: give it without {named}")
            if len(flags) > 1:
                raise CliError(
                    f"with {named} give at most one version flag; given: {flags_named(flags)}"
                    " (they are mutually exclusive)"
                )
            version = flags[0] if flags else "buffer"
            path = f"{SHIPYARD}/configdocs/{quote(collection, safe='')}"
            sys.stdout.write(request(target, "GET", path, params={"version": version}).text)
            return
        compare(target, flags, base_version, diff_version)

    run_command(target, command)


def compare(target: Target, flags: list[str], base: str | None, diff: str | None) -> None:
    if (base or diff) and flags:
        given = "--base-version" if base else "--diff-version"
        raise CliError(
            f"give two version flags or --base-version/--diff-version, not both; given:"
            f" {given} and {flags_named(flags)}"
        )
    if base or diff:
        params = [("base-version", version_name(base or "committed")),
                  ("diff-version", version_name(diff or "buffer"))]  # fmt: skip
    elif flags:
        if len(flags) != 2:
            raise CliError(
                f"to compare, give two version flags (or none: committed and buffer); given:"
                f" {flags_named(flags)}"
            )
        params = [("versions", v) for v in flags]
    else:
        params = [("versions", "committed"), ("versions", "buffer")]
    rows = parsed(request(target, "GET", f"{SHIPYARD}/configdocs", params=params))
    rows = rows if isinstance(rows, list) else []
    if rows:
        first = rows[0]
        out.print(
            f"Comparing Base: {first['base_version']} (Deckhand revision {first['base_revision']})"
            f" to New: {first['new_version']} (Deckhand revision {first['new_revision']})",
            highlight=False,
        )
    table = Table("Collection", "Base", "New")
    colours = {"created": "green", "deleted": "red", "modified": "yellow"}
    for row in rows:
        change = str(row.get("new_status"))
        colour = colours.get(change)
        shown = f"[{colour}]{escape(change)}[/{colour}]" if colour else escape(change)
        table.add_row(
            escape(str(row.get("collection_name"))), escape(str(row.get("base_status"))), shown
        )
    out.print(table)


@get_app.command("renderedconfigdocs")
def get_rendered(
    buffer: Buffer = False, committed: Committed = False, last_site_action: LastSiteAction = False,
    successful_site_action: SuccessfulSiteAction = False,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Every document at a version (one flag, default buffer), as YAML."""
    target = Target(url, ca, token, kubeconfig, lab_dir)
    flags = chosen(buffer, committed, last_site_action, successful_site_action)

    def command() -> None:
        if len(flags) > 1:
            raise CliError(f"the version flags are mutually exclusive; given: {flags_named(flags)}")
        params = {"version": flags[0] if flags else "buffer"}
        sys.stdout.write(
            request(target, "GET", f"{SHIPYARD}/renderedconfigdocs", params=params).text
        )

    run_command(target, command)


# ---- actions --------------------------------------------------------------------------------


def parameters(raw: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in raw:
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise CliError(f"--param {item!r} is not key=value")
        found[key.strip()] = value
    return found


@create_app.command("action")
def create_action(
    name: Annotated[
        str, typer.Argument(help="deploy_site, update_site, redeploy_server or relabel_nodes.")
    ],
    param: Annotated[
        list[str] | None, typer.Option("--param", help="key=value (repeat), e.g. target_nodes=n1")
    ] = None,
    allow_intermediate_commits: Annotated[
        bool, typer.Option(help="Deploy even if commits piled up since the last site action.")
    ] = False,
    watch: Watch = False,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Create an action; with --watch, follow it to its end."""
    target = Target(url, ca, token, kubeconfig, lab_dir)
    outcome = 0

    def command() -> None:
        nonlocal outcome
        body = {"name": name, "parameters": parameters(param or [])}
        params = {"allow-intermediate-commits": "true"} if allow_intermediate_commits else None
        action = parsed(request(target, "POST", f"{SHIPYARD}/actions", json=body, params=params))
        out.print(
            f"[green]Name: {escape(name)}  Action: action/{escape(action['id'])}"
            f"  Lifecycle: {escape(action['action_lifecycle'])}[/green]",
            highlight=False,
        )
        if watch:
            outcome = follow(target, action["id"])

    run_command(target, command)
    raise typer.Exit(outcome)


@get_app.command("actions")
def get_actions(
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Every action: Name, Action, Lifecycle, Execution Time, Step Succ/Fail/Oth."""
    target = Target(url, ca, token, kubeconfig, lab_dir)

    def command() -> None:
        found = parsed(request(target, "GET", f"{SHIPYARD}/actions"))
        table = Table(
            "Name", "Action", "Lifecycle", "Execution Time", "Step Succ/Fail/Oth", "Footnotes"
        )
        for action in found if isinstance(found, list) else []:
            counts = action.get("step_counts") or {}
            steps = "/".join(str(counts.get(k, 0)) for k in ("success", "failed", "other"))
            table.add_row(
                escape(str(action.get("name"))), f"action/{escape(str(action.get('id')))}",
                escape(str(action.get("action_lifecycle"))),
                escape(str(action.get("dag_execution_date"))), steps, "",
            )  # fmt: skip
        out.print(table)

    run_command(target, command)


Item = Annotated[
    str, typer.Argument(help="action/ID, action, step/ID/STEP or step (Shipyard's forms).")
]
ItemName = Annotated[
    str | None, typer.Argument(help="After 'action': the ID; after 'step': the STEP.")
]
ActionOption = Annotated[
    str | None, typer.Option("--action", "-a", help="The action of 'step STEP'.")
]


@site_app.command("describe")
def describe_item(
    item: Item,
    name: ItemName = None,
    action: ActionOption = None,
    watch: Watch = False,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """An action (its parameters, steps and their states, commands and notes) or one of its
    steps (its state and every note): describe action/ID, describe step/ID/STEP."""
    target = Target(url, ca, token, kubeconfig, lab_dir)
    outcome = 0

    def command() -> None:
        nonlocal outcome
        kind, found_id, step = named_item(item, name, action)
        if kind == "step":
            if watch:
                raise CliError("--watch follows an action: describe action/ID --watch")
            path = f"{SHIPYARD}/actions/{quote(found_id)}/steps/{quote(step, safe='')}"
            describe_step(found_id, parsed(request(target, "GET", path)))
            return
        if watch:
            outcome = follow(target, found_id)
            return
        describe(parsed(request(target, "GET", f"{SHIPYARD}/actions/{quote(found_id)}")))

    run_command(target, command)
    raise typer.Exit(outcome)


@site_app.command("stop")
def stop_item(
    item: Annotated[str, typer.Argument(help="action/ID, or action (then the ID).")],
    name: Annotated[str | None, typer.Argument(help="After 'action': the ID.")] = None,
    url: Url = None, ca: Ca = None, token: Token = None, kubeconfig: Kubeconfig = None,
    lab_dir: LabDir = Path(".lab"),
) -> None:  # fmt: skip
    """Stop an action (stop action/ID, or stop action ID): its running step ends at its
    next wait, no further step starts."""
    target = Target(url, ca, token, kubeconfig, lab_dir)

    def command() -> None:
        kind, found_id, _ = named_item(item, name, None)
        if kind != "action":
            raise CliError("only an action can be stopped: stop action/ID")
        path = f"{SHIPYARD}/actions/{quote(found_id)}/control/stop"
        show_status_answer(parsed(request(target, "POST", path)))

    run_command(target, command)


def describe_step(found_id: str, step: dict[str, Any]) -> None:
    fields = [
        ("Name", step.get("task_id")), ("Action", f"action/{found_id}"),
        ("Step", f"step/{found_id}/{step.get('task_id')}"), ("State", step.get("state")),
        ("Index", step.get("index")), ("Start date", step.get("start_date")),
        ("End date", step.get("end_date")), ("Try number", step.get("try_number")),
    ]  # fmt: skip
    for label, value in fields:
        out.print(f"{label + ':':16}{escape(str(value))}", highlight=False)
    for note in step.get("notes") or []:
        out.print(
            f"{clock(str(note.get('note_timestamp')))}  {escape(str(note.get('note_val')))}",
            highlight=False,
        )


def describe(action: dict[str, Any]) -> None:
    fields = [
        ("Name", action.get("name")), ("Action", f"action/{action.get('id')}"),
        ("Lifecycle", action.get("action_lifecycle")), ("Parameters", action.get("parameters")),
        ("Datetime", action.get("datetime")), ("Dag Status", action.get("dag_status")),
        ("Context Marker", action.get("context_marker")), ("User", action.get("user")),
        ("Design revision", action.get("design_revision") or action.get("committed_rev_id")),
    ]  # fmt: skip
    for label, value in fields:
        out.print(f"{label + ':':16}{escape(str(value))}", highlight=False)
    steps = Table("Steps", "Index", "State", "Last note")
    for step in action.get("steps") or []:
        notes = step.get("notes") or []
        last = notes[-1].get("note_val", "") if notes else ""
        steps.add_row(
            f"step/{escape(str(action.get('id')))}/{escape(str(step.get('id')))}",
            str(step.get("index")), state_shown(str(step.get("state"))), escape(str(last))[:160],
        )  # fmt: skip
    out.print(steps)
    commands = Table("Commands", "User", "Datetime")
    for entry in action.get("command_audit") or []:
        commands.add_row(escape(str(entry.get("command"))), escape(str(entry.get("user"))),
                         escape(str(entry.get("datetime"))))  # fmt: skip
    out.print(commands)
    for note in action.get("notes") or []:
        out.print(f"Note: {escape(str(note.get('note_val')))}", highlight=False)


def state_shown(state: str) -> str:
    colour = {"success": "green", "failed": "red", "running": "yellow"}.get(state)
    return f"[{colour}]{escape(state)}[/{colour}]" if colour else escape(state)


def follow(target: Target, found_id: str) -> int:
    """Print each new note of each step as it appears, with its time, until the action
    ends; then describe it. 0 when it completed, 1 when it failed."""
    printed: set[tuple[str, str, str]] = set()
    while True:
        action = parsed(request(target, "GET", f"{SHIPYARD}/actions/{quote(found_id)}", timeout=30))
        for step in action.get("steps") or []:
            for note in step.get("notes") or []:
                key = (
                    str(step.get("id")),
                    str(note.get("note_timestamp")),
                    str(note.get("note_val")),
                )
                if key not in printed:
                    printed.add(key)
                    out.print(
                        f"{clock(key[1])}  {escape(key[0]):20} {escape(key[2])}", highlight=False
                    )
        if action.get("action_lifecycle") in ("Complete", "Failed"):
            out.print()
            describe(action)
            return 0 if action["action_lifecycle"] == "Complete" else EXIT_FAILURE
        time.sleep(WATCH_SECONDS)


def clock(stamp: str) -> str:
    try:
        return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).strftime("%H:%M:%S.%f")[:-3]
    except ValueError:
        return stamp[:12]
