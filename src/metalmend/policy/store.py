"""Which store ``metalmend serve`` may serve (docs/design-store.md, "When the store is
replaced").

The database holds one store identity (a random id written when it was first migrated,
``metalmend.db.identity``); the cluster remembers the id serve last served (a ConfigMap in
serve's namespace, ``metalmend.serve.storeguard``), which outlives the database. At start:

| the cluster remembers | the database holds | serve |
|---|---|---|
| nothing (first start, or the record deleted by an operator) | any store | records it, serves |
| store A | store A (restarted, another replica, a backup of A restored) | serves |
| store A | store B, and ``serve.accept_store`` is B | records B, serves |
| store A | store B, and ``serve.store_loss_accepted`` (an emptyDir) | records B, serves, warns |
| store A | store B otherwise | refuses to start, saying both and how to confirm |
| store A | none: its SQLite file missing | refuses, leaves no file, says how to confirm |

Store B behind serve's URL means the records of A (design revisions and their
``committed``/``site-action-*`` tags, Drydock tasks, Shipyard actions) are not there: a
SQLite file removed or lost with its volume, another database. Serving B as if nothing had
happened would redo what A already recorded as done, or let a second destroy of a node
through; so an operator says so first, naming B (a setting naming the store accepted, not
a switch: left set, it accepts no later replacement).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class StoreId:
    """A store: its id and when it was created."""

    id: str
    created: dt.datetime

    def describe(self) -> str:
        return f"store {self.id} (created {self.created.strftime('%Y-%m-%d %H:%M:%S')} UTC)"


class Verdict(StrEnum):
    SERVE = "serve"  # the store recorded: serve it
    RECORD = "record"  # record this store in the cluster, then serve it
    REFUSE = "refuse"  # another store than the one recorded: do not start


@dataclass(frozen=True)
class StoreDecision:
    verdict: Verdict
    message: str  # what the log (serve, record) or the refusal says
    warn: bool = False  # records were lost: said at warning level


def decide_store(
    recorded: StoreId | None,
    current: StoreId,
    accepted: str,
    where: str,
    loss_accepted: bool = False,
    created: bool = False,
) -> StoreDecision:
    """``recorded``: what the cluster remembers (``where`` names it); ``current``: what
    the database holds; ``accepted``: ``serve.accept_store`` ("" unset);
    ``loss_accepted``: ``serve.store_loss_accepted``; ``created``: this start created the
    database (its SQLite file was missing), and removes it again when refused."""
    if recorded is None:
        return StoreDecision(
            Verdict.RECORD, f"serving {current.describe()}; recorded in {where} (none was)"
        )
    if recorded.id == current.id:
        return StoreDecision(Verdict.SERVE, f"serving {current.describe()}, as recorded in {where}")
    if accepted and accepted == current.id:
        return StoreDecision(
            Verdict.RECORD,
            f"serving {current.describe()} in place of {recorded.describe()}, as"
            f" serve.accept_store says; recorded in {where}",
        )
    if loss_accepted:
        return StoreDecision(
            Verdict.RECORD,
            f"serving {current.describe()} in place of {recorded.describe()}: the records of"
            f" the latter are lost (serve.store_loss_accepted); recorded in {where}",
            warn=True,
        )
    if created:
        return StoreDecision(
            Verdict.REFUSE,
            f"the database file does not exist, and metalmend serve served"
            f" {recorded.describe()} before ({where}): its records (design revisions and"
            " tags, tasks, actions) were in that file (removed, or lost with its volume);"
            f" nothing was created. Restore the file of store {recorded.id}, or, to start"
            f" an empty store in its place, delete {where} (the next start records the new"
            " store)",
        )
    return StoreDecision(
        Verdict.REFUSE,
        f"the database holds {current.describe()}, not {recorded.describe()} that"
        f" metalmend serve served before ({where}): its records (design revisions and tags,"
        " tasks, actions) are not in this database (a SQLite file removed or lost with its"
        " volume, or another database behind serve.database_url). Restore the database of"
        f" store {recorded.id}, or, to serve this one, set serve.accept_store={current.id}"
        f" (--accept-store {current.id})",
    )
