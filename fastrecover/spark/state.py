"""What the Spark sources keep in the range store, next to the range tokens.

Two small tables, created with ``create_all`` on first use (they are private to
the Spark integration and hold nothing the core reads, so they do not take part
in the core's Alembic migrations; ``fastrecover db upgrade`` leaves them alone):

``fastrecover_spark_queries``
    one row per streaming query name: the initial offset chosen the first time
    Spark asked (so ``initialOffset()`` answers the same on every call and after
    every restart) and the last offset Spark committed (for operators).
``fastrecover_spark_claims``
    one row per claim of a ``fastrecover-ranges`` batch job: which range tokens
    it took over, at which epoch, and from which offset it reads them.  A claim
    is *active* until :func:`fastrecover.spark.complete_ranges` (or
    ``abandon_ranges``) ends it, so every planning of the same job (``df.count()``
    then ``df.write``, a retried job) reads exactly the same records.

The streaming source also mirrors its backfill ranges into the core's
``fastrecover_ranges`` table (group ``spark-query:<name>``) so ``fastrecover``'s
status commands show them; that mirror is informational, the Spark checkpoint
stays the authority.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    and_,
    insert,
    select,
    update,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from fastrecover.errors import TokenNotFoundError
from fastrecover.ranges import RangeProgress
from fastrecover.recovery import this_cluster
from fastrecover.spark.offsets import SourceOffset
from fastrecover.store import ProgressUpdate, RangeStore
from fastrecover.store.engine import BEGIN_OPTION, translate_errors
from fastrecover.tokens import Token, TopicPartitionKey

log = logging.getLogger("fastrecover.spark")

QUERIES_TABLE = "fastrecover_spark_queries"
CLAIMS_TABLE = "fastrecover_spark_claims"

_metadata = MetaData()

queries = Table(
    QUERIES_TABLE,
    _metadata,
    Column("name", String(255), primary_key=True),
    Column("initial_offset", Text, nullable=False),
    Column("committed_offset", Text, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

claims = Table(
    CLAIMS_TABLE,
    _metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True),
    Column("group_id", String(255), nullable=False),
    Column("job", String(255), nullable=False),
    Column("generation", Integer, nullable=False),
    Column("owner", String(255), nullable=False),
    Column("state", String(16), nullable=False),
    Column("ranges", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("group_id", "job", "generation", name="uq_fastrecover_spark_claims_gen"),
)

ACTIVE, COMPLETED, ABANDONED = "active", "completed", "abandoned"


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True, slots=True)
class ClaimedRange:
    """One range token as a ranges job took it over: read ``[read_from, end)`` minus ``done``."""

    token_id: int
    epoch: int
    topic: str
    partition: int
    start: int
    end: int
    read_from: int
    done: tuple[int, ...] = ()

    @classmethod
    def of(cls, token: Token) -> ClaimedRange:
        p = token.progress
        return cls(
            token.id,
            token.epoch,
            token.topic,
            token.partition,
            p.start,
            p.end,
            p.committed,
            tuple(sorted(p.completed)),
        )

    def to_json(self) -> list[Any]:
        return [
            self.token_id,
            self.epoch,
            self.topic,
            self.partition,
            self.start,
            self.end,
            self.read_from,
            list(self.done),
        ]

    @classmethod
    def from_json(cls, raw: Sequence[Any]) -> ClaimedRange:
        tid, epoch, topic, partition, start, end, read_from, done = raw
        return cls(
            int(tid),
            int(epoch),
            str(topic),
            int(partition),
            int(start),
            int(end),
            int(read_from),
            tuple(int(o) for o in done),
        )


@dataclass(frozen=True, slots=True)
class Claim:
    group: str
    job: str
    generation: int
    owner: str
    state: str
    ranges: tuple[ClaimedRange, ...]


class SparkState:
    """The Spark tables in a range store; the tables are created on first use."""

    def __init__(self, store: RangeStore) -> None:
        self.store = store
        engine = store.engine
        self._engine = engine
        self._writer = engine.execution_options(**{BEGIN_OPTION: "IMMEDIATE"})
        with translate_errors(store.url, "creating the Spark tables"):
            _metadata.create_all(self._writer, checkfirst=True)

    @contextmanager
    def _tx(self, action: str) -> Iterator[Connection]:
        with translate_errors(self.store.url, action), self._writer.begin() as conn:
            yield conn

    # -- streaming queries ---------------------------------------------------------------------

    def initial_offset(self, query: str, compute: Callable[[], str]) -> str:
        """The query's persisted initial offset; ``compute()`` it and store it the first time.

        Insert-if-absent and read back, so two drivers racing on a new query name
        agree on one answer.
        """
        with self._tx(f"reading the initial offset of query {query!r}") as conn:
            row = conn.execute(select(queries.c.initial_offset).where(queries.c.name == query)).first()
        if row is not None:
            return str(row[0])
        value = compute()
        now = _now()
        try:
            with self._tx(f"recording the initial offset of query {query!r}") as conn:
                conn.execute(insert(queries).values(name=query, initial_offset=value, created_at=now, updated_at=now))
            log.info("query %r: recorded initial offset %s", query, value)
            return value
        except IntegrityError:
            with self._tx(f"reading the initial offset of query {query!r}") as conn:
                return str(conn.execute(select(queries.c.initial_offset).where(queries.c.name == query)).scalar_one())

    def record_commit(self, query: str, offset_json: str) -> None:
        with self._tx(f"recording the committed offset of query {query!r}") as conn:
            conn.execute(
                update(queries).where(queries.c.name == query).values(committed_offset=offset_json, updated_at=_now())
            )

    def committed_offset(self, query: str) -> str | None:
        with self._tx(f"reading query {query!r}") as conn:
            row = conn.execute(select(queries.c.committed_offset).where(queries.c.name == query)).first()
        return None if row is None or row[0] is None else str(row[0])

    # -- ranges jobs ---------------------------------------------------------------------------

    def active_claim(self, group: str, job: str) -> Claim | None:
        with self._tx(f"reading the claim of job {job!r} on group {group!r}") as conn:
            row = (
                conn.execute(
                    select(claims)
                    .where(and_(claims.c.group_id == group, claims.c.job == job, claims.c.state == ACTIVE))
                    .order_by(claims.c.generation.desc())
                )
                .mappings()
                .first()
            )
        return None if row is None else _claim(row)

    def claim_open_ranges(self, group: str, job: str, owner: str, cluster: str | None = None) -> Claim:
        """Take over every open range of ``group`` (epoch bump) and record the claim as active.

        With ``cluster`` (a :func:`fastrecover.codec.cluster_label`), only the ranges of that Kafka
        cluster: a store shared by two clusters holds the other's ranges under the same group and
        topic names, and reading them here would mark them done over records of the wrong log.

        An active claim of the same job is returned unchanged instead: planning
        twice must read the same records.  Unless its completion landed
        (:meth:`done_by_claim`): ``complete_ranges`` died between writing the
        progress and closing the claim, and reading the claim again would read
        records already done (and its completion would be fenced).  That claim
        is closed as completed and a new one is taken.
        """
        existing = self.active_claim(group, job)
        if existing is not None:
            if not self.done_by_claim(existing):
                return existing
            self.finish_claim(existing, COMPLETED)
            log.warning(
                "job %r on group %r: claim generation %d was completed but not closed (complete_ranges "
                "stopped in between); closed now",
                job,
                group,
                existing.generation,
            )
        taken: list[ClaimedRange] = []
        tokens = self.store.open_ranges(group)
        for token in tokens if cluster is None else this_cluster(tokens, cluster):
            claimed = self.store.claim(token.id, owner)
            if claimed.is_open:
                taken.append(ClaimedRange.of(claimed))
        with self._tx(f"recording the claim of job {job!r} on group {group!r}") as conn:
            last = conn.execute(
                select(claims.c.generation)
                .where(and_(claims.c.group_id == group, claims.c.job == job))
                .order_by(claims.c.generation.desc())
            ).first()
            generation = 1 if last is None else int(last[0]) + 1
            conn.execute(
                insert(claims).values(
                    group_id=group,
                    job=job,
                    generation=generation,
                    owner=owner,
                    state=ACTIVE,
                    ranges=json.dumps([r.to_json() for r in taken]),
                    created_at=_now(),
                )
            )
        log.info("job %r claimed %d open range(s) of group %r (generation %d)", job, len(taken), group, generation)
        return Claim(group, job, generation, owner, ACTIVE, tuple(taken))

    def done_by_claim(self, claim: Claim) -> list[Token]:
        """The claim's ranges as stored now that the claim's own completion made done (:func:`done_by`)."""
        tokens = []
        for r in claim.ranges:
            try:
                tokens.append(self.store.get(r.token_id))
            except TokenNotFoundError:
                continue  # deleted by hand: not a completion of this claim
        return done_by(claim, tokens)

    def finish_claim(self, claim: Claim, state: str) -> None:
        with self._tx(f"closing the claim of job {claim.job!r}") as conn:
            conn.execute(
                update(claims)
                .where(
                    and_(
                        claims.c.group_id == claim.group,
                        claims.c.job == claim.job,
                        claims.c.generation == claim.generation,
                        claims.c.state == ACTIVE,
                    )
                )
                .values(state=state, finished_at=_now())
            )

    # -- mirroring a streaming query's backfill ranges ------------------------------------------

    def mirror_pending(self, query: str, end: SourceOffset) -> None:
        """Bring the query's range tokens in line with the pending ranges of a committed offset."""
        group = owner = query_group(query)
        open_tokens = self.store.open_ranges(group)
        creates, updates = mirror_plan(open_tokens, end)
        for key, start, stop in creates:
            self.store.create_range(group, key.topic, key.partition, start, stop, owner)
        if updates:
            result = self.store.commit_progress(
                [ProgressUpdate(t.id, owner, t.epoch, progress) for t, progress in updates]
            )
            for token_id in result.fenced:
                log.warning("query %r: mirror of range #%d was fenced (someone claimed it)", query, token_id)


def done_by(claim: Claim, tokens: Sequence[Token]) -> list[Token]:
    """The ``tokens`` (ranges of ``claim`` as stored now) that the claim's completion made done.

    Done at the claim's owner and the epoch it claimed: only ``complete_ranges`` writes progress under
    that (owner, epoch), and it writes every range it still holds in one transaction, so one such token
    means the completion landed.  A range a consumer took back has a newer epoch and another owner.
    """
    claimed = {r.token_id: r.epoch for r in claim.ranges}
    return [
        t for t in tokens if not t.is_open and t.owner == claim.owner and t.id in claimed and t.epoch == claimed[t.id]
    ]


def query_group(query: str) -> str:
    """The token group under which a streaming query's backfill ranges are mirrored."""
    return f"spark-query:{query}"


def mirror_plan(
    open_tokens: Sequence[Token], end: SourceOffset
) -> tuple[list[tuple[TopicPartitionKey, int, int]], list[tuple[Token, RangeProgress]]]:
    """Which tokens to create and which progress to write so the tokens mirror ``end``'s pending ranges.

    A pending range ``[c, e)`` continues the open token of its partition that
    ends at ``e`` (backfill eats pending ranges from the front), so that token's
    committed offset becomes ``c``; an open token with no pending range left is
    done; a pending range with no token is new.
    """
    creates: list[tuple[TopicPartitionKey, int, int]] = []
    updates: list[tuple[Token, RangeProgress]] = []
    by_end = {(t.key, t.span.end): t for t in open_tokens if t.owner is not None}
    matched: set[int] = set()
    for key in end.keys_sorted():
        for r in end.partitions[key].pending:
            token = by_end.get((key, r.end))
            if token is not None and token.span.start <= r.start:
                matched.add(token.id)
                if r.start > token.progress.committed:
                    updates.append((token, token.progress.commit_upto(r.start)))
            else:
                creates.append((key, r.start, r.end))
    for token in open_tokens:
        if token.id not in matched and token.owner is not None:
            updates.append((token, token.progress.commit_upto(token.span.end)))
    return creates, updates


def _claim(row: Any) -> Claim:
    return Claim(
        group=row["group_id"],
        job=row["job"],
        generation=int(row["generation"]),
        owner=row["owner"],
        state=row["state"],
        ranges=tuple(ClaimedRange.from_json(r) for r in json.loads(row["ranges"])),
    )
