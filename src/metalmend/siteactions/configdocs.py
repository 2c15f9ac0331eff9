"""Shipyard's configdocs over the design store, and the admission of an action
(docs/site-actions.md): the buffer and its writers (one at a time), the buffer modes, the
versions a query names, what a site action would refuse in a design (validation), and
whether an action may be created now (a committed revision, the intermediate-commit
guard) and the action as created.

Domain code: it is passed what it works on (the design store, the action store, the clock,
the action plans), never the router's holder, and raises ``metalmend.errors``; the router
(``metalmend.siteactions.routes``) reads the request and translates. Synchronous: the
router calls it in a worker thread (``designs.access.run``).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from metalmend.clock import SYSTEM_CLOCK, Clock
from metalmend.db import Database
from metalmend.designs.documents import Document
from metalmend.designs.store import DesignStore
from metalmend.errors import Conflict, Invalid, NotFound
from metalmend.siteactions import model
from metalmend.siteactions.policy import actions as siteactions
from metalmend.siteactions.policy import deploysite
from metalmend.siteactions.policy.actions import ActionLifecycle, ActionName, Version
from metalmend.siteactions.steps import Planned
from metalmend.siteactions.store import ActionStore
from metalmend.teardown.etcd import design as etcd_design

BUFFER_MODES = ("rejectoncontents", "append", "replace")
Plans = Mapping[str, Sequence[Planned]]  # each action's steps (siteactions.worker.plans)


# ---- versions -------------------------------------------------------------------------------


def history(store: DesignStore) -> siteactions.History:
    return siteactions.History.of((s.id, s.tags) for s in store.revisions())


def revision_of(store: DesignStore, version: Version) -> int:
    found = siteactions.locate(history(store), version)
    if isinstance(found, siteactions.Absent):
        raise NotFound(f"no {version} version: {found.reason}")
    return found


def documents_of(
    store: DesignStore, revision: int, collection: str | None, *, status: bool = False
) -> list[dict[str, Any]]:
    """The documents of ``revision`` (one collection's, or all); with ``status`` as
    Deckhand answers them, each with ``status: {bucket, revision}`` (its collection and
    the revision read)."""
    return [
        {
            "schema": e.document.schema,
            "metadata": dict(e.document.metadata),
            "data": e.document.data,
        }
        | ({"status": {"bucket": e.bucket, "revision": revision}} if status else {})
        for e in store.entries(revision)
        if collection is None or e.bucket == collection
    ]


def buffer_changes(store: DesignStore, found: siteactions.History) -> dict[str, str]:
    """The collections the buffer changes from the committed revision (empty: no buffer)."""
    buffer = siteactions.locate(found, Version.BUFFER)
    if isinstance(buffer, siteactions.Absent):
        return {}
    committed = siteactions.locate(found, Version.COMMITTED)
    base = committed if isinstance(committed, int) else 0
    diff = store.diff(base, buffer)
    return {name: str(change) for name, change in diff.items() if str(change) != "unmodified"}


# ---- the buffer -----------------------------------------------------------------------------


_SQLITE_BUFFER = threading.Lock()


@contextlib.contextmanager
def buffer_writer(db: Database) -> Iterator[None]:
    """Serialize the buffer's writers: a put looks at the buffer, then (replace) rolls it
    back and puts; two operators putting at once must not both find it empty. On
    PostgreSQL (replicas) a transaction-level advisory lock, held on a connection of its
    own while the store's own transactions run; on SQLite (one replica) a lock in the
    process, since a second write transaction would wait for the first."""
    if db.dialect == "postgresql":
        with db.begin() as conn:
            db.lock(conn, "shipyard-configdocs-buffer")
            yield
    else:
        with _SQLITE_BUFFER:
            yield


def put_in_buffer(store: DesignStore, name: str, docs: Sequence[Document], mode: str) -> int:
    """Put collection ``name`` into the buffer by ``mode`` (one of ``BUFFER_MODES``): the
    design revision it made."""
    with buffer_writer(store.database):
        return _put_unlocked(store, name, docs, mode)


def _put_unlocked(store: DesignStore, name: str, docs: Sequence[Document], mode: str) -> int:
    found = history(store)
    changes = buffer_changes(store, found)
    if changes and mode == "rejectoncontents":
        listed = ", ".join(f"{c} ({s})" for c, s in sorted(changes.items()))
        raise Conflict(
            f"the buffer already holds changes not committed: {listed}. Commit them first"
            " (shipyard commit configdocs), or put again with --append (buffermode=append: add"
            " to them) or --replace (buffermode=replace: discard them)"
        )
    if mode == "append" and name in changes:
        raise Conflict(
            f"collection {name} is already in the buffer ({changes[name]}): --append"
            " (buffermode=append) adds a collection the buffer does not hold, as Shipyard"
            " does; put it with --replace (buffermode=replace) to discard the buffer first,"
            " or commit it (shipyard commit configdocs)"
        )
    if changes and mode == "replace":
        committed = siteactions.locate(found, Version.COMMITTED)
        store.rollback(committed if isinstance(committed, int) else 0)
    result = store.put(name, docs)
    if not result.created:
        raise Invalid(f"collection {name}: the documents are those already stored; nothing changed")
    return result.revision


def buffered(store: DesignStore) -> tuple[int, list[dict[str, Any]]]:
    """The buffer to commit: its revision and documents (Conflict: nothing to commit)."""
    found = history(store)
    if not buffer_changes(store, found):
        raise Conflict("There are no documents in the buffer to commit")
    revision = siteactions.locate(found, Version.BUFFER)
    assert isinstance(revision, int)
    return revision, documents_of(store, revision, None)


# ---- validation -----------------------------------------------------------------------------


def site_problems(
    docs: Sequence[dict[str, Any]], namespaces: Sequence[str], label_prefixes: Sequence[str]
) -> list[str]:
    """What a site action would refuse in these documents (the design's own checks: the
    cluster-side ones, Secrets and held hosts, wait for the action)."""
    problems = list(deploysite.read_site(docs, tuple(namespaces), tuple(label_prefixes)).problems)
    try:
        etcd_design.from_documents(docs, "the buffer")
    except etcd_design.DesignError as error:
        if not error.missing:
            problems.append(error.message)
    return problems


# ---- admission of an action -----------------------------------------------------------------


def admitted(store: DesignStore, name: ActionName, allow: bool) -> tuple[int | None, str | None]:
    """The committed revision, after the site actions' checks: one is committed, and the
    intermediate-commit guard (before any validation, as the spec words it); and what the
    guard let past (``allow``), to note on the action."""
    found = history(store)
    committed = siteactions.locate(found, Version.COMMITTED)
    if name not in siteactions.COMMITTED_ACTIONS:
        return (committed if isinstance(committed, int) else None), None
    if isinstance(committed, siteactions.Absent):
        raise Invalid(
            f"{name} needs committed configdocs: {committed.reason}"
            " (shipyard commit configdocs, or metalmend site commit configdocs)"
        )
    if name not in siteactions.SITE_ACTIONS:  # relabel_nodes: neither guarded nor tagged
        return committed, None
    verdict = siteactions.guard(name, found, committed, allow)
    if isinstance(verdict, siteactions.Refused):
        raise Conflict(verdict.message, [verdict.message], reason=verdict.title)
    return committed, verdict.log


@dataclass(frozen=True)
class ActionRequest:
    """An action as asked for, after the router's checks of the request and the caller's
    permissions: its name and parameters, and who asks (``caller``: as the TokenReview
    answered, stored to apply the design as them)."""

    name: ActionName
    parameters: dict[str, Any]
    allow_intermediate_commits: bool
    user: str
    caller: Mapping[str, Any]
    context_marker: str | None = None


@dataclass(frozen=True)
class Admission:
    """Creating an action: the checks of the design store (``admitted``), the action as
    created (its steps from ``plans``, its time from ``clock``) and its store, which
    refuses one that would collide with an action not finished (``ActionsCollide``)."""

    store: ActionStore
    plans: Plans
    clock: Clock = SYSTEM_CLOCK

    def create(self, designs: DesignStore, asked: ActionRequest) -> tuple[model.Action, str | None]:
        """The action stored, and what the guard let past (None: nothing)."""
        committed, skipped = admitted(designs, asked.name, asked.allow_intermediate_commits)
        action = self.new_action(asked, committed, skipped)
        self.store.create(action)
        return action, skipped

    def new_action(
        self, asked: ActionRequest, committed: int | None, skipped: str | None = None
    ) -> model.Action:
        now = self.clock.now()
        action_id = siteactions.new_action_id(now, os.urandom(10))
        steps = tuple(model.Step(p.name, i) for i, p in enumerate(self.plans[asked.name]))
        audit = {
            "action_id": action_id, "datetime": model.iso(now), "user": asked.user,
            "command": "invoke",
        }  # fmt: skip
        return model.Action(
            id=action_id, name=str(asked.name), parameters=asked.parameters,
            lifecycle=ActionLifecycle.PENDING, created=now, updated=now, user=asked.user,
            context_marker=asked.context_marker, committed_rev_id=committed, revision=None,
            allow_intermediate_commits=asked.allow_intermediate_commits, steps=steps,
            command_audit=(audit,), caller=dict(asked.caller),
            notes=(model.Note(now, skipped),) if skipped else (),
        )  # fmt: skip
