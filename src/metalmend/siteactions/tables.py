"""The action store's tables (declared on ``metalmend.db.metadata``; migration
``0003_actions``, ``0005_action_caller``).

One row per action, with the lease of the replica running it (``metalmend.db.lease``);
one row per (action, step), with the step's record (what it saved to resume after a
restart) and its notes as JSON. Times are naive UTC, as every table of metalmend's.
"""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    String,
    Table,
    Text,
)

from metalmend.db import metadata
from metalmend.db.lease import lease_columns

actions = Table(
    "shipyard_actions",
    metadata,
    Column("action_id", String(26), primary_key=True),  # a ULID
    Column("name", String(64), nullable=False),
    Column("parameters", JSON, nullable=False),
    Column("lifecycle", String(16), nullable=False),  # Pending, Processing, Complete, Failed
    Column("created", DateTime, nullable=False),
    Column("updated", DateTime, nullable=False),
    Column("user", String(512), nullable=False),
    Column("context_marker", String(36), nullable=True),
    Column("committed_rev_id", Integer, nullable=True),  # the committed revision when created
    Column("revision", Integer, nullable=True),  # the design revision the action uses
    Column("allow_intermediate_commits", Boolean, nullable=False),
    Column("notes", JSON, nullable=False),  # the action's own notes
    Column("command_audit", JSON, nullable=False),  # invoke, stop: who and when
    Column("stop_requested", Text, nullable=True),  # who asked to stop it, or NULL
    # who created it, as the TokenReview answered (username, uid, groups, extra): its
    # design is applied as them, and its per-node permissions checked again at its start
    # (migration 0005_action_caller; NULL for actions created before it: never run as serve)
    Column("caller", JSON, nullable=True),
    *lease_columns(),  # the replica running it and until when (metalmend.db.lease)
)
Index("ix_shipyard_actions_lifecycle", actions.c.lifecycle)

action_steps = Table(
    "shipyard_action_steps",
    metadata,
    Column(
        "action_id",
        String(26),
        ForeignKey("shipyard_actions.action_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("step", String(64), primary_key=True),
    Column("position", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("record", JSON, nullable=False),
    Column("notes", JSON, nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("start_date", DateTime, nullable=True),
    Column("end_date", DateTime, nullable=True),
)
