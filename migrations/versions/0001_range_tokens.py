"""Range tokens: the child consumer's commit log.

Revision ID: 0001
Revises:
Create Date: 2025-11-22

Written out by hand (not imported from fastrecover.store.models) so this
migration keeps creating exactly this schema however the models evolve.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_NOW = sa.text("CURRENT_TIMESTAMP")


def upgrade() -> None:
    op.create_table(
        "fastrecover_ranges",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("group_id", sa.String(255), nullable=False),
        sa.Column("topic", sa.String(255), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.Column("end_offset", sa.BigInteger(), nullable=False),
        sa.Column("committed_offset", sa.BigInteger(), nullable=False),
        sa.Column("completed", sa.Text(), nullable=False, server_default=""),
        sa.Column("skipped", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("owner", sa.String(255), nullable=True),
        sa.Column("epoch", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("state", sa.String(8), nullable=False, server_default="open"),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=_NOW),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_fastrecover_ranges")),
        sa.UniqueConstraint("group_id", "topic", "partition", "start_offset", name=op.f("uq_fastrecover_ranges_key")),
        sa.CheckConstraint("start_offset >= 0", name=op.f("ck_fastrecover_ranges_start_nonneg")),
        sa.CheckConstraint(
            "start_offset <= committed_offset AND committed_offset <= end_offset",
            name=op.f("ck_fastrecover_ranges_committed_in_range"),
        ),
        sa.CheckConstraint("state IN ('open', 'done')", name=op.f("ck_fastrecover_ranges_state_known")),
    )
    op.create_index(op.f("ix_fastrecover_ranges_group_state"), "fastrecover_ranges", ["group_id", "state"])


def downgrade() -> None:
    op.drop_index("ix_fastrecover_ranges_group_state", table_name="fastrecover_ranges")
    op.drop_table("fastrecover_ranges")
