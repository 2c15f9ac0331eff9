"""Site actions' rules, decided purely (docs/site-actions.md): the lifecycle of an action,
the design versions Shipyard names, the parameters each action takes. The service
(``siteactions.routes``) and its worker (``siteactions.worker``) ask these.

Shipyard (its API reference, https://airship-shipyard.readthedocs.io) finds every design
it works with by tags on the design store's revisions, and Airship's node teardown spec
("Shipyard Tag Releases" and "Shipyard redeploy_server Action") adds the site-action tags,
the intermediate-commit guard and redeploy_server's parameters. This module holds those
rules and nothing else: which revision a version names, whether an action may start,
which tag it leaves, what a redeploy asked for, how two versions compare, and the
actions' ids and lifecycle. Inputs are frozen views and plain values; nothing here reads
the store, a clock or a random source.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

# The tags Shipyard puts on design revisions (the shared vocabulary: Deckhand's routes
# keep them too).
from metalmend.api.tags import COMMIT_TAGS as COMMIT_TAGS
from metalmend.api.tags import COMMITTED_TAG as COMMITTED_TAG
from metalmend.api.tags import FAILURE_TAG as FAILURE_TAG
from metalmend.api.tags import ROLLBACK_COMMIT_TAG as ROLLBACK_COMMIT_TAG
from metalmend.api.tags import SITE_ACTION_TAGS as SITE_ACTION_TAGS
from metalmend.api.tags import SUCCESS_TAG as SUCCESS_TAG

# --- the design's versions ------------------------------------------------------------


class Version(StrEnum):
    """The versions Shipyard names (``version=`` and ``versions=`` in its configdocs API)."""

    # In Shipyard's order from the oldest to the newest: a comparison puts the older first.
    SUCCESSFUL_SITE_ACTION = "successful_site_action"
    LAST_SITE_ACTION = "last_site_action"
    COMMITTED = "committed"
    BUFFER = "buffer"


_VERSION_ORDER = tuple(Version)


@dataclass(frozen=True)
class Revision:
    """A design revision as these rules see it: its number and its tags' names."""

    id: int
    tags: frozenset[str]


@dataclass(frozen=True)
class History:
    """Every revision of the design store, newest first (build it with ``History.of``)."""

    revisions: tuple[Revision, ...]

    @classmethod
    def of(cls, revisions: Iterable[tuple[int, Iterable[str]]]) -> History:
        found = (Revision(number, frozenset(tags)) for number, tags in revisions)
        return cls(tuple(sorted(found, key=lambda revision: revision.id, reverse=True)))

    def newest_tagged(self, tags: frozenset[str]) -> Revision | None:
        return next((r for r in self.revisions if r.tags & tags), None)


@dataclass(frozen=True)
class Absent:
    """A version that names no revision, and why (the operator reads the reason)."""

    version: Version
    reason: str


def locate(history: History, version: Version) -> int | Absent:
    """The revision a version names, exactly as Shipyard's configdocs helper finds it."""
    if version is Version.BUFFER:
        return _buffer(history)
    wanted, name = {
        Version.COMMITTED: (COMMIT_TAGS, "committed or rollback_commit"),
        Version.LAST_SITE_ACTION: (SITE_ACTION_TAGS, "site-action-success or site-action-failure"),
        Version.SUCCESSFUL_SITE_ACTION: (frozenset({SUCCESS_TAG}), SUCCESS_TAG),
    }[version]
    found = history.newest_tagged(wanted)
    if found is None:
        return Absent(version, f"no revision is tagged {name}")
    return found.id


def _buffer(history: History) -> int | Absent:
    # The buffer is the newest revision while it is not itself committed: what was put
    # since the last commit. With nothing put since, there is no buffer.
    if not history.revisions:
        return Absent(Version.BUFFER, "the design store holds no revision")
    newest = history.revisions[0]
    if newest.tags & COMMIT_TAGS:
        return Absent(Version.BUFFER, f"nothing was put since revision {newest.id} was committed")
    return newest.id


def version_named(raw: object) -> Version | str:
    """A ``version=`` value (Shipyard's underscore names; the spec's hyphenated ones too),
    or the message saying which values exist."""
    if isinstance(raw, str):
        try:
            return Version(raw.strip().lower().replace("-", "_"))
        except ValueError:
            pass
    valid = ", ".join(_VERSION_ORDER)
    return f"{_shown(raw)} is not a valid version, which include: {valid}"


# --- actions: names, ids, lifecycle ---------------------------------------------------


class ActionName(StrEnum):
    DEPLOY_SITE = "deploy_site"
    UPDATE_SITE = "update_site"
    REDEPLOY_SERVER = "redeploy_server"
    RELABEL_NODES = "relabel_nodes"


# The actions that bring the whole site to its design: the node teardown spec calls them
# "site actions"; only they are guarded and only they are tagged. redeploy_server is not
# one: the spec words the guard for "deploy site or update site requests", and it deploys
# one server from an already tagged revision (successful-site-action by default), so it
# neither adds a commit nor marks one as deployed. Upstream Shipyard agrees (its check runs
# for deploy_site, update_site and update_software; redeploy_server does not tag).
SITE_ACTIONS = frozenset({ActionName.DEPLOY_SITE, ActionName.UPDATE_SITE})
# The actions that use the committed revision and need one (Shipyard's
# validate_committed_revision); relabel_nodes, a target action, is neither guarded nor
# tagged.
COMMITTED_ACTIONS = SITE_ACTIONS | {ActionName.RELABEL_NODES}

# Shipyard's other actions, which a site served by metalmend cannot run, and why: they are
# answered as Shipyard answers an action it does not have ("Unable to start action",
# reason "Unsupported Action: NAME"), the reason in the message list.
UNSUPPORTED_ACTIONS = {
    "update_software": (
        "update_software runs Armada to install the site's software (Helm charts); metalmend"
        " serve deploys servers, not software, and has no Armada: there is nothing for it to"
        " update (deploy_site or update_site bring the servers to the committed design)"
    ),
    "test_site": (
        "test_site runs the Helm tests of Armada's releases; metalmend serve installs no"
        " release, so there is nothing to test. The servers' health is what the site can"
        " show: shipyard get site-statuses (provisioning, power and each node's last action)"
    ),
}
UNSUPPORTED = "Unable to start action"  # Shipyard's title for them


class ActionLifecycle(StrEnum):
    """Shipyard's ``action_lifecycle`` (upstream's Paused went with pause/unpause)."""

    PENDING = "Pending"
    PROCESSING = "Processing"
    COMPLETE = "Complete"
    FAILED = "Failed"


CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # base32 without I, L, O, U
_ULID = re.compile(f"[0-7][{CROCKFORD}]{{25}}")


def new_action_id(now: dt.datetime, entropy: bytes) -> str:
    """A ULID, as Shipyard names its actions: 48 bits of milliseconds since the epoch then
    80 random bits (the caller passes ``os.urandom(10)``), 26 Crockford base32 characters.
    Ids sort by creation time, which is why Shipyard lists actions by them."""
    if now.tzinfo is None:
        raise ValueError("an action id needs an aware time")
    if len(entropy) != 10:
        raise ValueError(f"an action id needs 10 random bytes, got {len(entropy)}")
    millis = int(now.timestamp() * 1000)
    if not 0 <= millis < 1 << 48:
        raise ValueError(f"{now.isoformat()} is outside what an action id can hold")
    number = millis << 80 | int.from_bytes(entropy, "big")
    return "".join(CROCKFORD[number >> shift & 31] for shift in range(125, -1, -5))


def is_action_id(raw: object) -> bool:
    return isinstance(raw, str) and _ULID.fullmatch(raw) is not None


# --- the intermediate-commit guard -----------------------------------------------------

INTERMEDIATE_COMMIT = "Intermediate commit detected"  # Shipyard's 409 title


@dataclass(frozen=True)
class Allowed:
    """The action may go on; ``log`` is the line to log (the check skipped), or None."""

    log: str | None = None


@dataclass(frozen=True)
class Refused:
    """The action is refused before validation; ``intermediate`` are the revisions found."""

    title: str
    message: str
    intermediate: tuple[int, ...]


def intermediate_commits(history: History, current: int) -> tuple[int, ...]:
    """The spec's rule: the committed revisions after the last revision tagged by a site
    action (revision 0 if none is) and before ``current``, the revision the action uses.
    Stricter than upstream, which only looks at the second newest commit."""
    last = history.newest_tagged(SITE_ACTION_TAGS)
    since = last.id if last is not None else 0
    return tuple(
        sorted(
            r.id
            for r in history.revisions
            if since < r.id < current and r.tags & COMMIT_TAGS and not r.tags & SITE_ACTION_TAGS
        )
    )


def guard(
    action: ActionName, history: History, current: int, allow_intermediate_commits: bool
) -> Allowed | Refused:
    if action not in SITE_ACTIONS:
        return Allowed()
    if allow_intermediate_commits:
        return Allowed(
            f"{action}: allow-intermediate-commits=true, the intermediate committed"
            " revisions check is skipped"
        )
    found = intermediate_commits(history, current)
    if not found:
        return Allowed()
    last = history.newest_tagged(SITE_ACTION_TAGS)
    since = f"revision {last.id}" if last is not None else "none yet"
    listed = ", ".join(str(number) for number in found)
    return Refused(
        INTERMEDIATE_COMMIT,
        f"{action} of committed revision {current} refused: revision(s) {listed} were"
        f" committed since the last site action ({since}) and never deployed. Review them"
        " (shipyard get configdocs --committed --last-site-action; or metalmend site get"
        " configdocs --last-site-action --committed), then create the action again with"
        " --allow-intermediate-commits (allow-intermediate-commits=true) to deploy them all"
        " at once.",
        found,
    )


CONTINUE_ON_FAIL = "continue-on-fail"


def site_parameters(action: str, parameters: Mapping[str, Any]) -> str | None:
    """What is wrong with a deploy_site's or update_site's parameters (None: nothing).
    Shipyard's CLI documents ``--param continue-on-fail=true`` for them; both values are
    accepted. What true changes (docs/site-actions.md): in ``wait``, a host that fails no
    longer stops the wait for the others, whose Nodes are labelled and waited for; the
    action still fails, naming the failed hosts. Validation is never skipped (Shipyard's
    true would go on past a design that does not validate; here that design would be
    applied as its caller with the checks that keep it from powering, fencing or
    reaching another tenant's hosts skipped). Anything else is refused by name."""
    problems = []
    for name, raw in parameters.items():
        if name != CONTINUE_ON_FAIL:
            problems.append(f"{str(name)[:64]!r}")
            continue
        found = boolean_parameter(name, raw, False)
        if isinstance(found, str):
            return found
    if problems:
        given = ", ".join(problems)[:200]
        return f"{action} takes only {CONTINUE_ON_FAIL} (true or false); given: {given}"
    return None


def boolean_parameter(name: str, raw: object, default: bool) -> bool | str:
    """A true/false parameter: a JSON boolean or the CLI's "true"/"false" (any case)."""
    if raw is None:
        return default
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
        return raw.strip().lower() == "true"
    return f"{name} must be true or false, not {_shown(raw)}"


# --- the tags after an action -----------------------------------------------------------


@dataclass(frozen=True)
class TagRevision:
    """Tag ``revision`` with ``tag`` and this data (the design store replaces an existing
    tag's data and keeps every other tag: a revision may carry both outcomes)."""

    revision: int
    tag: str
    data: Mapping[str, str]


def completion_tag(
    action: ActionName, revision: int, dag_id: str, validated: bool, succeeded: bool
) -> TagRevision | None:
    """The spec: a site action ends by tagging the revision it used, success or failure,
    with the body ``dag_id:<dag_id>``; a failure only once validation passed (the action
    got to change something). Other actions do not tag."""
    if action not in SITE_ACTIONS:
        return None
    if succeeded:
        return TagRevision(revision, SUCCESS_TAG, {"dag_id": dag_id})
    if not validated:
        return None
    return TagRevision(revision, FAILURE_TAG, {"dag_id": dag_id})


# --- redeploy_server's parameters ---------------------------------------------------------

TARGET_NODES = "target_nodes"  # Shipyard's name for the node(s) to act on
PRESERVE_LOCAL_STORAGE = "preserve-local-storage"
TARGET_REVISION = "target-revision"
MAX_TARGET_NODES = 64
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

# target-revision's values as the spec spells them, and the version each names.
TARGET_REVISIONS: Mapping[str, Version] = {
    "committed": Version.COMMITTED,
    "successful-site-action": Version.SUCCESSFUL_SITE_ACTION,
    "last-site-action": Version.LAST_SITE_ACTION,
}


@dataclass(frozen=True)
class RedeployParameters:
    target_nodes: tuple[str, ...]
    preserve_local_storage: bool = False  # the spec: local storage is wiped by default
    target_revision: Version = Version.SUCCESSFUL_SITE_ACTION  # the last known good design


@dataclass(frozen=True)
class BadParameters:
    """The action is refused (400); each problem is one line for the operator."""

    problems: tuple[str, ...]


def redeploy_parameters(raw: object) -> RedeployParameters | BadParameters:
    if not isinstance(raw, Mapping):
        return BadParameters((f"parameters must be a mapping, not {_kind(raw)}",))
    unknown = [key for key in raw if key not in _REDEPLOY_KEYS]
    problems = [_unknown(key) for key in unknown[:5]]  # a hostile mapping: a few suffice
    nodes = target_nodes(raw.get(TARGET_NODES))
    preserve = boolean_parameter(PRESERVE_LOCAL_STORAGE, raw.get(PRESERVE_LOCAL_STORAGE), False)
    revision = target_revision(raw.get(TARGET_REVISION))
    # A Version is a str too (StrEnum): tell the problems apart by their type.
    problems += [p for p in (nodes, preserve, revision) if type(p) is str]
    if problems or not (
        isinstance(nodes, tuple) and isinstance(preserve, bool) and isinstance(revision, Version)
    ):
        return BadParameters(tuple(problems))
    return RedeployParameters(nodes, preserve, revision)


_REDEPLOY_KEYS = (TARGET_NODES, PRESERVE_LOCAL_STORAGE, TARGET_REVISION)


def _unknown(key: object) -> str:
    # A typo must not silently mean the default: "preserve_local_storage=true" ignored
    # would wipe the data drives the operator meant to keep.
    wanted = ", ".join(_REDEPLOY_KEYS)
    return (
        f"redeploy_server has no parameter {_shown(key)}; its parameters are {wanted}"
        " (a misspelt one is refused, not read as its default: a typo of"
        " preserve-local-storage would wipe the data drives)"
    )


def target_nodes(raw: object, doing: str = "redeploy") -> tuple[str, ...] | str:
    """Node names from a list or from the CLI's one comma-separated string."""
    if raw is None:
        return f"{TARGET_NODES} is required: the node(s) to {doing}"
    if isinstance(raw, str):
        raw = raw.split(",") if len(raw) <= MAX_TARGET_NODES * 254 else [raw]
    if not isinstance(raw, list | tuple):
        return f"{TARGET_NODES} must be a list of node names, not {_kind(raw)}"
    if len(raw) > MAX_TARGET_NODES:
        return f"{TARGET_NODES} names {len(raw)} nodes; at most {MAX_TARGET_NODES} at once"
    names: list[str] = []
    for item in raw:
        name = item.strip() if isinstance(item, str) else item
        if not isinstance(name, str) or len(name) > 253 or not _NODE_NAME.fullmatch(name):
            return f"{TARGET_NODES}: {_shown(item)} is not a node name (RFC 1123, at most 253)"
        if name not in names:
            names.append(name)
    if not names:
        return f"{TARGET_NODES} is empty: name the node(s) to {doing}"
    return tuple(names)


def target_revision(raw: object) -> Version | str:
    if raw is None:
        return Version.SUCCESSFUL_SITE_ACTION
    if isinstance(raw, str):
        key = raw.strip().lower().replace("_", "-")
        if key in TARGET_REVISIONS:
            return TARGET_REVISIONS[key]
    valid = " | ".join(TARGET_REVISIONS)
    return f"{TARGET_REVISION} must be {valid}, not {_shown(raw)}"


@dataclass(frozen=True)
class MissingPrecondition:
    """The action fails before anything is touched (the spec: "fail due to a missing
    precondition")."""

    message: str


def redeploy_design(history: History, wanted: Version) -> int | MissingPrecondition:
    """The revision a redeploy uses as its design, looked up before any step changes
    anything (decommission, destroy and the redeploy all read this one revision)."""
    found = locate(history, wanted)
    if isinstance(found, Absent):
        spelled = next(k for k, v in TARGET_REVISIONS.items() if v is wanted)
        return MissingPrecondition(
            f"{TARGET_REVISION}={spelled} names no revision ({found.reason}); nothing was touched"
        )
    return found


# --- configdocs status between two versions --------------------------------------------


@dataclass(frozen=True)
class BadRequest:
    message: str  # 400


@dataclass(frozen=True)
class NotFound:
    message: str  # 404


@dataclass(frozen=True)
class Comparison:
    """Two versions resolved to revisions, the older (in Shipyard's order) as the base."""

    base_version: Version
    base_revision: int
    new_version: Version
    new_revision: int


def compared_versions(raw: Sequence[object] | None) -> tuple[Version, Version] | BadRequest:
    """``versions=A&versions=B`` (or ``version=A,B``): exactly two distinct valid versions,
    default committed and buffer, put in Shipyard's order (older first)."""
    if not raw:
        return Version.COMMITTED, Version.BUFFER
    names: list[object] = []
    for item in raw[:3]:
        names += item.split(",")[:3] if isinstance(item, str) else [item]
    if len(names) != 2:
        return BadRequest("User must pass in 2 valid versions for comparison")
    first, second = version_named(names[0]), version_named(names[1])
    if first == second:  # also "committed" and "Committed": the same version
        return BadRequest("Versions must be unique in order to perform comparison")
    if not isinstance(first, Version):
        return BadRequest(first)
    if not isinstance(second, Version):
        return BadRequest(second)
    if _VERSION_ORDER.index(first) > _VERSION_ORDER.index(second):
        return second, first
    return first, second


def compare(history: History, base: Version, new: Version) -> Comparison | NotFound:
    """Shipyard's rules: a site-action version that does not exist is 404; a missing
    committed base compares from revision 0 (the empty design) to the buffer; a missing
    newer version (no buffer) compares a revision with itself (everything unmodified)."""
    found = {version: locate(history, version) for version in (base, new)}
    for version in (base, new):
        where = found[version]
        if isinstance(where, Absent) and version in _SITE_ACTION_VERSIONS:
            return NotFound(f"{version} version does not exist: {where.reason}")
    buffer = locate(history, Version.BUFFER)
    buffer_id = buffer if isinstance(buffer, int) else None
    base_id, new_id = found[base], found[new]
    if isinstance(base_id, Absent):  # only committed can be missing here
        return Comparison(base, 0, new, buffer_id or 0)
    if isinstance(new_id, Absent):
        return Comparison(base, base_id, new, buffer_id or base_id)
    return Comparison(base, base_id, new, new_id)


_SITE_ACTION_VERSIONS = frozenset({Version.LAST_SITE_ACTION, Version.SUCCESSFUL_SITE_ACTION})
_BUCKET_STATUSES = frozenset({"created", "modified", "deleted", "unmodified"})


def configdocs_status(comparison: Comparison, diff: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per collection, as Shipyard's ``GET /configdocs`` answers, from the design
    store's per-bucket diff between the two revisions (``DesignStore.diff``: it already
    reports from the older revision to the newer)."""
    rows = []
    for collection, change in diff.items():
        if change not in _BUCKET_STATUSES:
            # The store computes these; anything else is a bug there, not a user's error.
            raise ValueError(f"collection {collection!r} has an invalid status {change!r}")
        rows.append(
            {
                "collection_name": collection,
                "base_version": str(comparison.base_version),
                "base_revision": comparison.base_revision,
                "new_version": str(comparison.new_version),
                "new_revision": comparison.new_revision,
                "base_status": "not present" if change == "created" else "present",
                "new_status": str(change),
            }
        )
    return rows


# --- messages --------------------------------------------------------------------------


def _shown(raw: object) -> str:
    """A value as a message quotes it: short, so that a huge hostile value is not echoed."""
    text = repr(raw)
    return text if len(text) <= 64 else f"{text[:60]}...{text[-1]} ({len(text)} characters)"


def _kind(raw: object) -> str:
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(raw), "null" if raw is None else f"a {type(raw).__name__}"
    )


# --- actions side by side ---------------------------------------------------------------


@dataclass(frozen=True)
class Running:
    """An action not finished: its id, name and the nodes it redeploys (none: all)."""

    id: str
    name: str
    targets: frozenset[str] = frozenset()


def collision(name: ActionName, targets: Iterable[str], running: Iterable[Running]) -> str | None:
    """Why a new action cannot start while others run, or None. A site action changes
    every host: it runs alone. Redeploys of different servers may run side by side; two
    of one server would race on its host (and its etcd member)."""
    wanted = frozenset(targets)
    for other in running:
        if name in SITE_ACTIONS or other.name in SITE_ACTIONS:
            return f"action {other.id} ({other.name}) is running: {name} waits until it ends"
        shared = sorted(wanted & other.targets)
        if shared:
            doing = "relabelling" if other.name == ActionName.RELABEL_NODES else "redeploying"
            return f"action {other.id} ({other.name}) is already {doing} {', '.join(shared)}"
    return None


def relabel_parameters(raw: object) -> tuple[str, ...] | BadParameters:
    """relabel_nodes' one parameter, ``target_nodes`` (required, as Shipyard's
    validate_target_nodes has it): the Nodes whose design labels to apply. Anything else
    is refused by name, as for redeploy_server."""
    if not isinstance(raw, Mapping):
        return BadParameters((f"parameters must be a mapping, not {_kind(raw)}",))
    problems = [
        f"relabel_nodes has no parameter {_shown(key)}; its one parameter is {TARGET_NODES}"
        for key in list(raw)[:5]
        if key != TARGET_NODES
    ]
    nodes = target_nodes(raw.get(TARGET_NODES), "relabel")
    if isinstance(nodes, str):
        problems.append(nodes)
    if problems or isinstance(nodes, str):
        return BadParameters(tuple(problems))
    return nodes


def action_targets(name: str, parameters: object) -> tuple[str, ...]:
    """The nodes an action acts on (redeploy_server's and relabel_nodes' target_nodes;
    none for a site action, which acts on every host)."""
    if name == ActionName.REDEPLOY_SERVER:
        found = redeploy_parameters(parameters)
        return found.target_nodes if isinstance(found, RedeployParameters) else ()
    if name == ActionName.RELABEL_NODES:
        nodes = relabel_parameters(parameters)
        return nodes if isinstance(nodes, tuple) else ()
    return ()
