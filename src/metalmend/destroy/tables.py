"""The task store's tables (declared on ``metalmend.db.metadata``; migration ``0002_tasks``).

One row per task, one per (task, node), one per node being destroyed (``node_claims``,
migration ``0004_records``: its primary key is the node, so the database itself refuses a
second task of a node, whatever the number of requests or replicas racing). A node's
progress is its ``NodeState`` as JSON (``policy.destroy`` owns that format); the task row
carries the lease that makes one replica, and only one, run it (``store.TaskStore``).
Times are stored as naive UTC (SQLite keeps no time zone), and compared in SQL only with
each other.
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

tasks = Table(
    "drydock_tasks",
    metadata,
    Column("task_id", String(36), primary_key=True),
    Column("action", String(64), nullable=False),
    Column("design_ref", Text, nullable=False),
    Column("node_filter", JSON, nullable=True),
    Column("preserve_local_storage", Boolean, nullable=False),
    Column("status", String(16), nullable=False),
    Column("created", DateTime, nullable=False),
    Column("created_by", String(512), nullable=False),
    Column("updated", DateTime, nullable=False),
    Column("context_marker", String(36), nullable=True),
    *lease_columns(),  # the replica running it and until when (metalmend.db.lease)
)
Index("ix_drydock_tasks_status", tasks.c.status)

task_nodes = Table(
    "drydock_task_nodes",
    metadata,
    Column(
        "task_id",
        String(36),
        ForeignKey("drydock_tasks.task_id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("node", String(253), primary_key=True),
    Column("position", Integer, nullable=False),  # order given in the request
    Column("state", JSON, nullable=False),
    Column("updated", DateTime, nullable=False),
)

# A node is being destroyed from the moment a task naming it is stored (in the same
# transaction) until that node's record is finished, or its task complete.
node_claims = Table(
    "drydock_node_claims",
    metadata,
    Column("node", String(253), primary_key=True),
    Column(
        "task_id",
        String(36),
        ForeignKey("drydock_tasks.task_id", ondelete="CASCADE"),
        nullable=False,
    ),
)
Index("ix_drydock_node_claims_task_id", node_claims.c.task_id)
