"""The store's identity (``metalmend.db.identity``: one row, a random id written here, so
``metalmend serve`` can tell its store from another behind the same URL) and Drydock's node
claims (``drydock_node_claims``: one row per node being destroyed, its primary key the
node, so that two tasks can never destroy one node at once: docs/destroy.md).

Existing tasks not complete claim their nodes (the oldest task first, should two already
hold one: the bug this fixes let that happen).

Revision ID: 0004_records
Revises: 0003_actions
"""

from __future__ import annotations

import datetime as dt
import uuid

import sqlalchemy as sa
from alembic import op

revision = "0004_records"
down_revision = "0003_actions"
branch_labels = None
depends_on = None


def upgrade() -> None:
    identity = op.create_table(
        "store_identity",
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("store_id", sa.String(32), nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_store_identity"),
    )
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    op.bulk_insert(identity, [{"id": 1, "store_id": uuid.uuid4().hex, "created_at": now}])
    claims = op.create_table(
        "drydock_node_claims",
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.PrimaryKeyConstraint("node", name="pk_drydock_node_claims"),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["drydock_tasks.task_id"],
            name="fk_drydock_node_claims_task_id_drydock_tasks",
            ondelete="CASCADE",
        ),
    )
    op.create_index("ix_drydock_node_claims_task_id", "drydock_node_claims", ["task_id"])
    tasks = sa.table(
        "drydock_tasks", sa.column("task_id"), sa.column("status"), sa.column("created")
    )
    nodes = sa.table("drydock_task_nodes", sa.column("task_id"), sa.column("node"))
    running = (
        sa.select(nodes.c.node, nodes.c.task_id)
        .join(tasks, tasks.c.task_id == nodes.c.task_id)
        .where(tasks.c.status != "complete")
        .order_by(tasks.c.created, tasks.c.task_id)
    )
    claimed: dict[str, str] = {}
    for node, task_id in op.get_bind().execute(running):
        claimed.setdefault(str(node), str(task_id))
    if claimed:
        op.bulk_insert(claims, [{"node": n, "task_id": t} for n, t in claimed.items()])


def downgrade() -> None:
    op.drop_index("ix_drydock_node_claims_task_id", table_name="drydock_node_claims")
    op.drop_table("drydock_node_claims")
    op.drop_table("store_identity")
