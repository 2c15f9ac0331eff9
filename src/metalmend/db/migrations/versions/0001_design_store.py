"""The design store (docs/design-store.md): revisions, the documents of each revision,
document contents stored once whatever the number of revisions holding them, tags.

Revision ID: 0001_design_store
Revises: (none)
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_design_store"
down_revision = None
branch_labels = None
depends_on = None

NAME = 255  # a document's schema or name, a bucket's or a tag's name


def upgrade() -> None:
    # One row: the last revision number given out. Writers lock it, so numbers are never
    # given twice and never reused, not even after DELETE /revisions.
    counter = op.create_table(
        "design_counter",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("last_revision", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_design_counter"),
    )
    op.bulk_insert(counter, [{"id": 1, "last_revision": 0}])
    op.create_table(
        "design_revisions",
        sa.Column("id", sa.Integer, autoincrement=False, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_design_revisions"),
    )
    op.create_table(
        "design_contents",
        sa.Column("id", sa.Integer, autoincrement=True, nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("body", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_design_contents"),
        sa.UniqueConstraint("digest", name="uq_design_contents_digest"),
    )
    op.create_table(
        "design_revision_documents",
        sa.Column("revision_id", sa.Integer, nullable=False),
        sa.Column("schema", sa.String(NAME), nullable=False),
        sa.Column("name", sa.String(NAME), nullable=False),
        sa.Column("bucket", sa.String(NAME), nullable=False),
        sa.Column("content_id", sa.Integer, nullable=False),
        sa.Column("changed_in", sa.Integer, nullable=False),
        sa.PrimaryKeyConstraint(
            "revision_id", "schema", "name", name="pk_design_revision_documents"
        ),
        sa.ForeignKeyConstraint(
            ["revision_id"],
            ["design_revisions.id"],
            ondelete="CASCADE",
            name="fk_design_revision_documents_revision_id_design_revisions",
        ),
        sa.ForeignKeyConstraint(
            ["content_id"],
            ["design_contents.id"],
            name="fk_design_revision_documents_content_id_design_contents",
        ),
    )
    op.create_index(
        "ix_design_revision_documents_content_id", "design_revision_documents", ["content_id"]
    )
    op.create_table(
        "design_tags",
        sa.Column("revision_id", sa.Integer, nullable=False),
        sa.Column("tag", sa.String(NAME), nullable=False),
        sa.Column("data", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("revision_id", "tag", name="pk_design_tags"),
        sa.ForeignKeyConstraint(
            ["revision_id"],
            ["design_revisions.id"],
            ondelete="CASCADE",
            name="fk_design_tags_revision_id_design_revisions",
        ),
    )
    op.create_index("ix_design_tags_tag", "design_tags", ["tag"])


def downgrade() -> None:
    op.drop_table("design_tags")
    op.drop_table("design_revision_documents")
    op.drop_table("design_contents")
    op.drop_table("design_revisions")
    op.drop_table("design_counter")
