"""Spark as the backfill engine of a consumer group: ``format("fastrecover-ranges")``.

When one child thread is not enough to drain the lag a ``fastrecover.Consumer``
skipped, a batch job reads the group's open range tokens instead::

    df = (spark.read.format("fastrecover-ranges")
          .option("kafka.bootstrap.servers", servers)
          .option("fastrecover.store.url", url)
          .option("group", "orders").load())
    df.write.parquet(...)                       # the user's write
    complete_ranges(url, "orders")              # only after the write succeeded

Hand-off rules (the store's owner/epoch fencing enforces them):

* Planning CLAIMS every open range of the group for the job (owner
  ``spark-ranges:<job>``, epoch bumped) and records the claim.  A consumer
  still holding one of them is fenced on its next commit of that range and
  drops it; it may have delivered some of its records already (at-least-once).
* While the claim is active, every planning of the same job (``df.count()``
  then ``df.write``, a re-run after a failed write) reads exactly the claimed
  records: the claim is not taken again.
* ``complete_ranges`` marks exactly the claimed ranges done, each only if the
  job still holds it at the claimed epoch.  A range a consumer took back in
  between (its recovery claims every open range of the partitions it is
  assigned) is reported as fenced and stays open: the consumer finishes it.
* ``abandon_ranges`` gives the claimed ranges up (owner cleared); a consumer
  takes them at its next assignment of their partitions.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from fastrecover.codec import cluster_label
from fastrecover.errors import FastRecoverError
from fastrecover.ranges import OffsetRange, RangeProgress, subtract
from fastrecover.spark.offsets import Piece
from fastrecover.spark.options import RangesOptions, parse_ranges_options
from fastrecover.spark.planning import chunk_tasks
from fastrecover.spark.source import SCHEMA, PieceSet, read_task
from fastrecover.spark.state import ABANDONED, COMPLETED, Claim, ClaimedRange, SparkState
from fastrecover.store import CommitResult, ProgressUpdate, open_store
from fastrecover.tokens import Token

log = logging.getLogger("fastrecover.spark")

__all__ = [
    "FastRecoverRangesDataSource",
    "RangeCompletion",
    "abandon_ranges",
    "claim_pieces",
    "complete_ranges",
]


def claim_pieces(ranges: Sequence[ClaimedRange]) -> list[Piece]:
    """The offsets a claim still has to read: ``[read_from, end)`` minus the out-of-order finished ones."""
    pieces: list[Piece] = []
    for r in ranges:
        holes = [OffsetRange(o, o + 1) for o in r.done]
        for span in subtract(OffsetRange(r.read_from, r.end), holes):
            pieces.append(Piece(r.topic, r.partition, span.start, span.end, True))
    return pieces


def _cluster_id(kafka: dict[str, str], timeout_s: float) -> str | None:
    """The id of the Kafka cluster the job reads (None from brokers too old to have one).

    Asked before anything is claimed: a store shared by two clusters holds the other's ranges too.
    """
    from confluent_kafka import Consumer, KafkaException

    conf: dict[str, Any] = {**kafka, "enable.auto.commit": False}
    conf.setdefault("group.id", "fastrecover-ranges-planner")
    try:
        client = Consumer(conf)
    except KafkaException as exc:
        raise FastRecoverError(f"ranges job: cannot create a Kafka client from the kafka.* options: {exc}") from exc
    try:
        found: str | None = client.list_topics(timeout=timeout_s).cluster_id
        return found
    except KafkaException as exc:
        raise FastRecoverError(
            f"ranges job: cannot ask Kafka at {kafka.get('bootstrap.servers')} for its cluster id "
            f"within {timeout_s:g} s, so nothing was claimed: {exc}"
        ) from exc
    finally:
        client.close()


class FastRecoverRangesReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: RangesOptions) -> None:
        self.options = options

    def partitions(self) -> list[PieceSet]:
        opts = self.options
        cluster = cluster_label(_cluster_id(opts.kafka, opts.read_timeout_s))
        store = open_store(opts.store_url)
        try:
            claim = SparkState(store).claim_open_ranges(opts.group, opts.job, opts.owner, cluster)
        finally:
            store.close()
        pieces = claim_pieces(claim.ranges)
        tasks = chunk_tasks(pieces, opts.backfill_tasks)
        log.info(
            "ranges job %r on group %r: %d range(s), %d records to read, %d task(s)",
            opts.job,
            opts.group,
            len(claim.ranges),
            sum(p.end - p.start for p in pieces),
            len(tasks),
        )
        # An empty list would make Spark plan one partition with a None value.
        return [PieceSet(tuple(t)) for t in tasks] or [PieceSet(())]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, PieceSet):
            raise FastRecoverError(f"unexpected input partition {partition!r}")
        opts = self.options
        return read_task(
            opts.kafka,
            partition.pieces,
            fail_on_data_loss=opts.fail_on_data_loss,
            timeout_s=opts.read_timeout_s,
        )


class FastRecoverRangesDataSource(DataSource):  # type: ignore[misc]
    """``spark.read.format("fastrecover-ranges")``: the records of a group's open range tokens."""

    @classmethod
    def name(cls) -> str:
        return "fastrecover-ranges"

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> FastRecoverRangesReader:
        return FastRecoverRangesReader(parse_ranges_options(self.options))


@dataclass(frozen=True)
class RangeCompletion:
    """What :func:`complete_ranges` did: ranges now done, and ranges someone else holds (left open)."""

    job: str
    group: str
    completed: list[Token] = field(default_factory=list)
    fenced: list[int] = field(default_factory=list)

    @property
    def records(self) -> int:
        return sum(len(t.span) for t in self.completed)


def complete_ranges(store_url: str, group: str, job: str = "default") -> RangeCompletion:
    """Mark exactly the ranges the job's active claim read as done; call after the write succeeded.

    Each range is completed with the job's (owner, epoch), so one a consumer
    claimed back meanwhile is fenced (reported, left open) rather than
    overwritten.  Without an active claim there is nothing to do.  Called again
    after it died between the progress and the claim's close, it reports the
    ranges its first call completed as completed, not fenced.
    """
    store = open_store(store_url)
    try:
        state = SparkState(store)
        claim = state.active_claim(group, job)
        if claim is None:
            log.info("ranges job %r on group %r has no active claim: nothing to complete", job, group)
            return RangeCompletion(job, group)
        # The progress of every range still held is written in one transaction: if one range is done under
        # the claim's (owner, epoch), an earlier call's write landed and only the claim's close is missing.
        landed = state.done_by_claim(claim)
        if landed:
            ids = {t.id for t in landed}
            result = CommitResult(list(landed), [r.token_id for r in claim.ranges if r.token_id not in ids])
        else:
            updates = [
                ProgressUpdate(r.token_id, claim.owner, r.epoch, RangeProgress(r.start, r.end, r.end))
                for r in claim.ranges
            ]
            result = store.commit_progress(updates)
        state.finish_claim(claim, COMPLETED)
    finally:
        store.close()
    done = RangeCompletion(job, group, list(result.tokens), list(result.fenced))
    log.info(
        "ranges job %r on group %r: %d range(s) done (%d records), %d fenced (kept open for their holder)",
        job,
        group,
        len(done.completed),
        done.records,
        len(done.fenced),
    )
    return done


def abandon_ranges(store_url: str, group: str, job: str = "default") -> Claim | None:
    """Give up the job's active claim without completing it (the write failed for good)."""
    store = open_store(store_url)
    try:
        state = SparkState(store)
        claim = state.active_claim(group, job)
        if claim is None:
            return None
        for r in claim.ranges:
            store.release(r.token_id, claim.owner, r.epoch)
        state.finish_claim(claim, ABANDONED)
        log.info("ranges job %r on group %r abandoned %d range(s)", job, group, len(claim.ranges))
        return claim
    finally:
        store.close()
