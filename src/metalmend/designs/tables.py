"""The design store's tables, as migration ``0001_design_store`` creates them (the
migration is the schema's history; these are what code queries)."""

from __future__ import annotations

import sqlalchemy as sa

from metalmend.db import metadata

NAME = 255

counter = sa.Table(
    "design_counter",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("last_revision", sa.Integer, nullable=False),
)

revisions = sa.Table(
    "design_revisions",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

contents = sa.Table(
    "design_contents",
    metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("digest", sa.String(64), nullable=False, unique=True),
    sa.Column("body", sa.Text, nullable=False),  # canonical JSON of the whole document
)

revision_documents = sa.Table(
    "design_revision_documents",
    metadata,
    sa.Column(
        "revision_id",
        sa.Integer,
        sa.ForeignKey("design_revisions.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("schema", sa.String(NAME), primary_key=True),
    sa.Column("name", sa.String(NAME), primary_key=True),
    sa.Column("bucket", sa.String(NAME), nullable=False),
    sa.Column("content_id", sa.Integer, sa.ForeignKey("design_contents.id"), nullable=False),
    sa.Column("changed_in", sa.Integer, nullable=False),  # status.revision
    sa.Index("ix_design_revision_documents_content_id", "content_id"),
)

tags = sa.Table(
    "design_tags",
    metadata,
    sa.Column(
        "revision_id",
        sa.Integer,
        sa.ForeignKey("design_revisions.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    sa.Column("tag", sa.String(NAME), primary_key=True),
    sa.Column("data", sa.Text, nullable=False),  # JSON mapping
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Index("ix_design_tags_tag", "tag"),
)
