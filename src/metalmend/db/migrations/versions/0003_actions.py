"""Shipyard's actions (docs/site-actions.md): one row per action with the lease of the
replica running it, one row per (action, step) with the step's record and notes
(``metalmend.siteactions.tables``).

Revision ID: 0003_actions
Revises: 0002_tasks
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_actions"
down_revision = "0002_tasks"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "shipyard_actions",
        sa.Column("action_id", sa.String(26), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("parameters", sa.JSON, nullable=False),
        sa.Column("lifecycle", sa.String(16), nullable=False),
        sa.Column("created", sa.DateTime, nullable=False),
        sa.Column("updated", sa.DateTime, nullable=False),
        sa.Column("user", sa.String(512), nullable=False),
        sa.Column("context_marker", sa.String(36), nullable=True),
        sa.Column("committed_rev_id", sa.Integer, nullable=True),
        sa.Column("revision", sa.Integer, nullable=True),
        sa.Column("allow_intermediate_commits", sa.Boolean, nullable=False),
        sa.Column("notes", sa.JSON, nullable=False),
        sa.Column("command_audit", sa.JSON, nullable=False),
        sa.Column("stop_requested", sa.Text, nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires", sa.DateTime, nullable=True),
        sa.PrimaryKeyConstraint("action_id", name="pk_shipyard_actions"),
    )
    op.create_index("ix_shipyard_actions_lifecycle", "shipyard_actions", ["lifecycle"])
    op.create_table(
        "shipyard_action_steps",
        sa.Column("action_id", sa.String(26), nullable=False),
        sa.Column("step", sa.String(64), nullable=False),
        sa.Column("position", sa.Integer, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("record", sa.JSON, nullable=False),
        sa.Column("notes", sa.JSON, nullable=False),
        sa.Column("try_number", sa.Integer, nullable=False),
        sa.Column("start_date", sa.DateTime, nullable=True),
        sa.Column("end_date", sa.DateTime, nullable=True),
        sa.PrimaryKeyConstraint("action_id", "step", name="pk_shipyard_action_steps"),
        sa.ForeignKeyConstraint(
            ["action_id"],
            ["shipyard_actions.action_id"],
            name="fk_shipyard_action_steps_action_id_shipyard_actions",
            ondelete="CASCADE",
        ),
    )


def downgrade() -> None:
    op.drop_table("shipyard_action_steps")
    op.drop_index("ix_shipyard_actions_lifecycle", table_name="shipyard_actions")
    op.drop_table("shipyard_actions")
