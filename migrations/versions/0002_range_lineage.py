"""Range lineages and superseded ranges.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26

A range now names the lineage that vouches for it (``lineage``: the Kafka
cluster id and a nonce) and its cluster (``cluster``, '' when unknown), and a
range whose facts Kafka's committed offset no longer vouches for is kept as
``superseded`` instead of being used.  The natural key becomes (group, topic,
partition, start, cluster) and is unique among the ranges that are not
superseded: a new range can start where a superseded one did, and two clusters
sharing a store each keep their own ranges.

Written out by hand, like 0001.  On SQLite the table is rebuilt (batch mode)
from the 0001 definition given here, not from reflection.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TABLE = "fastrecover_ranges"
_OLD_KEY = ("group_id", "topic", "partition", "start_offset")
_KEY = (*_OLD_KEY, "cluster")
_LIVE = sa.text("state <> 'superseded'")
_NOW = sa.text("CURRENT_TIMESTAMP")


def _revision_0001() -> sa.Table:
    """The table exactly as 0001 created it: the copy SQLite's rebuild starts from."""
    return sa.Table(
        _TABLE,
        sa.MetaData(),
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
        sa.PrimaryKeyConstraint("id", name="pk_fastrecover_ranges"),
        sa.UniqueConstraint(*_OLD_KEY, name="uq_fastrecover_ranges_key"),
        sa.CheckConstraint("start_offset >= 0", name="ck_fastrecover_ranges_start_nonneg"),
        sa.CheckConstraint(
            "start_offset <= committed_offset AND committed_offset <= end_offset",
            name="ck_fastrecover_ranges_committed_in_range",
        ),
        sa.CheckConstraint("state IN ('open', 'done')", name="ck_fastrecover_ranges_state_known"),
        sa.Index("ix_fastrecover_ranges_group_state", "group_id", "state"),
    )


def upgrade() -> None:
    with op.batch_alter_table(_TABLE, copy_from=_revision_0001()) as batch:
        batch.add_column(sa.Column("lineage", sa.String(255), nullable=True))
        batch.add_column(sa.Column("cluster", sa.String(255), nullable=False, server_default=""))
        batch.alter_column("state", existing_type=sa.String(8), type_=sa.String(16), existing_nullable=False)
        batch.drop_constraint(op.f("uq_fastrecover_ranges_key"), type_="unique")
        batch.drop_constraint(op.f("ck_fastrecover_ranges_state_known"), type_="check")
        batch.create_check_constraint(
            op.f("ck_fastrecover_ranges_state_known"), "state IN ('open', 'done', 'superseded')"
        )
    op.create_index(
        op.f("uq_fastrecover_ranges_key"), _TABLE, list(_KEY), unique=True, sqlite_where=_LIVE, postgresql_where=_LIVE
    )


def downgrade() -> None:
    op.execute(sa.text(f"DELETE FROM {_TABLE} WHERE state = 'superseded'"))
    op.drop_index("uq_fastrecover_ranges_key", table_name=_TABLE)
    with op.batch_alter_table(_TABLE) as batch:
        batch.drop_constraint(op.f("ck_fastrecover_ranges_state_known"), type_="check")
        batch.create_check_constraint(op.f("ck_fastrecover_ranges_state_known"), "state IN ('open', 'done')")
        batch.create_unique_constraint(op.f("uq_fastrecover_ranges_key"), list(_OLD_KEY))
        batch.alter_column("state", existing_type=sa.String(16), type_=sa.String(8), existing_nullable=False)
        batch.drop_column("cluster")
        batch.drop_column("lineage")
