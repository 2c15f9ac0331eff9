"""Drydock's tasks (docs/destroy.md): one row per task with the lease of the replica
running it, one row per (task, node) with the node's record as JSON
(``metalmend.destroy.tables``).

Revision ID: 0002_tasks
Revises: 0001_design_store
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_tasks"
down_revision = "0001_design_store"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "drydock_tasks",
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("design_ref", sa.Text, nullable=False),
        sa.Column("node_filter", sa.JSON, nullable=True),
        sa.Column("preserve_local_storage", sa.Boolean, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("created_by", sa.String(512), nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.Column("context_marker", sa.String(36), nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires", sa.DateTime, nullable=True),
        sa.PrimaryKeyConstraint("task_id", name="pk_drydock_tasks"),
    )
    op.create_index("ix_drydock_tasks_status", "drydock_tasks", ["status"])
    op.create_table(
        "drydock_task_nodes",
        sa.Column("task_id", sa.String(36), nullable=False),
        sa.Column("node", sa.String(253), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("state", sa.JSON, nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.PrimaryKeyConstraint("task_id", "node", name="pk_drydock_task_nodes"),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["drydock_tasks.task_id"],
            name="fk_drydock_task_nodes_task_id_drydock_tasks",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("drydock_task_nodes")
    op.drop_index("ix_drydock_tasks_status", table_name="drydock_tasks")
    op.drop_table("drydock_tasks")
