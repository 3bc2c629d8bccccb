"""``format("fastrecover")``: a Structured Streaming source with KIP-333 fast recovery.

The thin imperative shell around :mod:`fastrecover.spark.offsets` and
:mod:`fastrecover.spark.planning`: it fetches watermarks, keeps the little run
state recovery needs (the jump decided at the first planning after a start,
the Trigger.AvailableNow targets), and lets the pure functions decide every
offset and every task.

Where each method runs: ``initialOffset``/``latestOffset``/``partitions``/
``commit`` in one long-lived Python process on the driver; ``read`` in Python
workers on the executors, on an unpickled copy of a reader that never planned
anything.  So no client is created in ``__init__`` and nothing ``read`` needs
comes from run state.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from fastrecover.errors import ConfigError, FastRecoverError
from fastrecover.spark.commit_mirror import CommitMirror
from fastrecover.spark.kafka import LogView
from fastrecover.spark.offsets import Piece, SourceOffset, batch_pieces, lost_between, pending_total
from fastrecover.spark.options import SourceOptions, parse_source_options
from fastrecover.spark.planning import (
    apply_jumps,
    chunk_tasks,
    discover,
    has_fresh,
    initial_offset,
    plan_next,
    recovery_jumps,
)
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.spark")

#: Spark's Kafka source schema, plus ``backfill``: true for a record of a recovered lag.
_FIELDS = [
    StructField("key", BinaryType(), True),
    StructField("value", BinaryType(), True),
    StructField("topic", StringType(), True),
    StructField("partition", IntegerType(), True),
    StructField("offset", LongType(), True),
    StructField("timestamp", TimestampType(), True),
    StructField("timestampType", IntegerType(), True),
    StructField("backfill", BooleanType(), True),
]
SCHEMA = StructType(list(_FIELDS))
#: Spark's ``headers`` column (includeHeaders=true): key/value pairs in record order.
HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType(), True), StructField("value", BinaryType(), True)])),
    True,
)
SCHEMA_WITH_HEADERS = StructType([*_FIELDS[:7], HEADERS_FIELD, _FIELDS[7]])


def source_schema(include_headers: bool) -> StructType:
    return SCHEMA_WITH_HEADERS if include_headers else SCHEMA


def trace(event: str) -> None:
    """Profiling aid: with FASTRECOVER_SPARK_TRACE=<file>, append ``<epoch seconds> <pid> <event>``."""
    path = os.environ.get("FASTRECOVER_SPARK_TRACE")
    if path:
        with open(path, "a") as fh:
            fh.write(f"{time.time():.4f} {os.getpid()} {event}\n")


def arrow_schema(include_headers: bool = False) -> Any:
    """The Arrow schema Spark expects of batches in the source schema (checked by the Python worker)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(source_schema(include_headers), timezone="UTC")


class PieceSet(InputPartition):  # type: ignore[misc]
    """One Spark task: offset ranges to read, in order."""

    def __init__(self, pieces: tuple[Piece, ...]) -> None:
        super().__init__(pieces)
        self.pieces = pieces

    def __repr__(self) -> str:
        return (
            "PieceSet("
            + ", ".join(f"{p.topic}[{p.partition}][{p.start},{p.end}){'b' if p.backfill else ''}" for p in self.pieces)
            + ")"
        )


def read_task(
    kafka: Mapping[str, str],
    pieces: tuple[Piece, ...],
    *,
    fail_on_data_loss: bool,
    timeout_s: float,
    include_headers: bool = False,
) -> Iterator[Any]:
    if not pieces:
        return iter(())
    # Imported here, by reference: the planning process never needs the reading code (see _pickled_by_value).
    from fastrecover.spark.kafka import read_pieces

    return read_pieces(
        kafka, pieces, arrow_schema(include_headers), fail_on_data_loss=fail_on_data_loss, timeout_s=timeout_s
    )


def backfill_budget(limit: ReadLimit, default: int | None) -> int | None:
    """Backfill offsets the next batch may take: Spark's ReadAllAvailable means all of them.

    ``maxBackfillOffsetsPerTrigger`` reaches us as the ReadMaxRows of
    getDefaultReadLimit(); it bounds the backfill only, live records are never held back.
    """
    if isinstance(limit, ReadAllAvailable):
        return None
    if isinstance(limit, ReadMaxRows):
        return int(limit.max_rows)
    return default


#: latestOffset's "no batch yet" while a recovery waits for fresh data.
_HOLD = SourceOffset({})


@dataclass
class _Hold:
    """A recovery decided at the first planning of this run, waiting for a fresh record to cut the batch."""

    jumps: dict[TopicPartitionKey, int]
    deadline: float


class FastRecoverStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._view: LogView | None = None
        self._state: Any = None
        self._first_plan = True
        self._hold: _Hold | None = None
        self._targets: dict[TopicPartitionKey, int] | None = None
        self._mirror: CommitMirror | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Tasks get the options only: no clients, no planning state.
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # -- lazily created driver-side clients ------------------------------------------------------

    def _log_view(self) -> LogView:
        if self._view is None:
            self._view = LogView(self.options.kafka, timeout_s=self.options.read_timeout_s)
        return self._view

    def _spark_state(self) -> Any:
        if self._state is None:
            from fastrecover.spark.state import SparkState
            from fastrecover.store import open_store

            self._state = SparkState(open_store(self.options.store_url))
        return self._state

    def _bounds(self, known: SourceOffset | None = None) -> dict[TopicPartitionKey, Any]:
        opts = self.options
        if opts.assign is not None:
            keys = {TopicPartitionKey(t, p) for t, p in opts.assign}
        elif opts.pattern is not None:
            keys = set(self._log_view().partitions_matching(opts.matches))
        else:
            keys = set(self._log_view().partitions(opts.topics))
        if known is not None:
            keys |= {k for k in known.keys_sorted() if opts.matches(k.topic)}
        return self._log_view().bounds(sorted(keys, key=lambda k: (k.topic, k.partition)))

    # -- DataSourceStreamReader ----------------------------------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        opts = self.options

        def compute() -> str:
            bounds = self._bounds()
            specific = None
            if opts.starting_specific is not None:
                specific = {TopicPartitionKey(t, p): o for t, p, o in opts.starting_specific}
                if opts.pattern is not None:  # a pattern's topics without an offset start at their log end
                    specific = {**{k: -1 for k in bounds}, **specific}
            try:
                return initial_offset(bounds, opts.starting, specific).dumps()
            except ValueError as exc:
                raise ConfigError(f"option startingOffsets: {exc} (name every partition the query reads)") from exc

        trace("initialOffset")
        return SourceOffset.from_json(self._spark_state().initial_offset(opts.query, compute)).to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_backfill is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_backfill)

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = self._bounds()
        self._targets = {k: b.high for k, b in bounds.items()}
        log.info(
            "query %r: Trigger.AvailableNow drains up to %s",
            self.options.query,
            {str(k): v for k, v in self._targets.items()},
        )

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        trace("latestOffset")
        begin = SourceOffset.from_json(start)
        bounds = self._bounds(begin)
        if self._targets is not None:
            bounds = {k: b for k, b in bounds.items() if k in self._targets}
            ends = {k: min(b.high, self._targets[k]) for k, b in bounds.items()}
        else:
            ends = {k: b.high for k, b in bounds.items()}
        seen = discover(begin, bounds)
        budget = backfill_budget(limit, self.options.max_backfill)
        if self._first_plan and budget is None:
            # ReadAllAvailable (Trigger.Once, or the engine's own choice): everything in this one
            # batch, so a jump would only reorder records inside it.
            self._first_plan = False
        if self._first_plan:
            end = self._recovery_batch(seen, ends)
            if end is _HOLD:
                return start
            if end is not None:
                return end.to_json()
        return plan_next(seen, ends, jumps=None, backfill_budget=budget, live_limit=self.options.max_live).to_json()

    def _recovery_batch(self, seen: SourceOffset, ends: dict[TopicPartitionKey, int]) -> SourceOffset | None:
        """The first batch of this run: jump lagging partitions to the log end; None for a normal batch,
        ``_HOLD`` to run no batch yet.

        The jump points are fixed at the first call; the batch is cut once a
        record past them exists (so it carries fresh data), after freshWaitMs,
        or at once under Trigger.AvailableNow.  Until then latestOffset answers
        the start offset: Spark runs no batch and asks again.
        """
        opts = self.options
        if self._hold is None:
            jumps = recovery_jumps(seen, ends, opts.min_lag)
            if not jumps:
                self._first_plan = False
                return None
            self._hold = _Hold(jumps, time.monotonic() + opts.fresh_wait_s)
            log.info(
                "query %r: restart with a lag on %s; live reading resumes at the log end, the lag is backfilled",
                opts.query,
                ", ".join(
                    f"{k} [{seen.partitions[k].live}, {j})"
                    for k, j in sorted(jumps.items(), key=lambda kv: (kv[0].topic, kv[0].partition))
                ),
            )
        hold = self._hold
        if (
            self._targets is None
            and not has_fresh(apply_jumps(seen, hold.jumps), ends)
            and (time.monotonic() < hold.deadline)
        ):
            return _HOLD
        self._first_plan = False
        self._hold = None
        end = plan_next(seen, ends, jumps=hold.jumps, backfill_budget=0, live_limit=opts.max_live)
        log.info("query %r: recovery batch cut; %d offsets to backfill", opts.query, pending_total(end))
        return end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[PieceSet]:
        begin, finish = SourceOffset.from_json(start), SourceOffset.from_json(end)
        lost = lost_between(begin, finish)
        if lost:
            raise FastRecoverError(
                f"offset {finish.dumps()} does not contain everything offset {begin.dumps()} delivered "
                f"(missing {lost}); the checkpoint does not belong to this source"
            )
        trace("partitions")
        pieces = batch_pieces(begin, finish)
        opts = self.options
        tasks = chunk_tasks(pieces, opts.backfill_tasks, opts.max_live_per_task, opts.min_partitions)
        return [PieceSet(tuple(t)) for t in tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, PieceSet):
            raise FastRecoverError(f"unexpected input partition {partition!r}")
        opts = self.options
        trace("read")
        return read_task(
            opts.kafka,
            partition.pieces,
            fail_on_data_loss=opts.fail_on_data_loss,
            timeout_s=opts.read_timeout_s,
            include_headers=opts.include_headers,
        )

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every batch up to ``end``: mirror its finished backfill ranges into the store.

        Informational only (the checkpoint is the authority), so it is written
        by a background thread, off Spark's trigger loop, and a store problem
        is logged while the query goes on.
        """
        if self._mirror is None:
            self._mirror = CommitMirror(self.options.query, self._spark_state)
        self._mirror.submit(SourceOffset.from_json(end))

    def stop(self) -> None:
        if self._mirror is not None:
            self._mirror.close(timeout_s=30.0)
            self._mirror = None
        if self._state is not None:
            self._state.store.close()
            self._state = None
        if self._view is not None:
            self._view.close()
            self._view = None


class FastRecoverDataSource(DataSource):  # type: ignore[misc]
    """``spark.readStream.format("fastrecover")``: Kafka with fast recovery after downtime."""

    @classmethod
    def name(cls) -> str:
        return "fastrecover"

    def schema(self) -> StructType:
        return source_schema(parse_source_options(self.options).include_headers)

    def streamReader(self, schema: StructType) -> FastRecoverStreamReader:
        trace("streamReader")
        return FastRecoverStreamReader(parse_source_options(self.options))
