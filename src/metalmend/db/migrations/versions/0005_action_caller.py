"""Who created each Shipyard action (docs/site-actions.md, "Whose permissions apply a
design"): the caller's identity as the TokenReview answered it (username, uid, groups,
extra), so that the action's design is applied as that caller (impersonation) and its
per-node permissions are checked again when it starts. NULL for actions created before:
those fail at their first step rather than run as metalmend serve.

Revision ID: 0005_action_caller
Revises: 0003_actions
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_action_caller"
down_revision = "0004_records"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("shipyard_actions") as batch:
        batch.add_column(sa.Column("caller", sa.JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("shipyard_actions") as batch:
        batch.drop_column("caller")
