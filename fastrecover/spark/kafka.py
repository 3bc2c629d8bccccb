"""Kafka access for the Spark sources: log bounds on the driver, offset-range reads in tasks.

Both sides build their librdkafka configuration from the data source options
(``kafka.*`` keys, prefix stripped, as with Spark's own Kafka source).  Clients
are never created when a reader is constructed or unpickled: the driver side
creates its AdminClient on first use, and a task takes a Consumer from a
per-process cache, so a reused Python worker reads many tasks with one
consumer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

# LogView (the planning side) imports the client inside its methods: this module is pickled by value into
# Spark's planning process (fastrecover.spark.register), and names bound here would be pickled with it.
from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from fastrecover.errors import DataLossError as DataLossError  # re-exported: it was defined here
from fastrecover.errors import FastRecoverError
from fastrecover.spark.offsets import LogBounds, Piece
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.spark")

#: librdkafka settings of range reads: a range read knows where it stops, so the
#: broker must not hold a fetch open waiting for records that are not coming.
RANGE_READ_TUNING: Mapping[str, Any] = {"fetch.wait.max.ms": 10}
#: Settings no ``kafka.*`` option may change (applied last): a read never joins a group nor commits, and an
#: offset that is gone is an error (data loss is detected, never silently reset).
RANGE_READ_DEFAULTS: Mapping[str, Any] = {
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
    "auto.offset.reset": "error",
    "enable.partition.eof": True,
    "group.id": "fastrecover-spark-reader",
}
_CONSUME_BATCH = 5000


def _isolation(conf: Mapping[str, str]) -> Any:
    from confluent_kafka import IsolationLevel

    level = str(conf.get("isolation.level", "read_uncommitted")).lower()
    return IsolationLevel.READ_COMMITTED if level == "read_committed" else IsolationLevel.READ_UNCOMMITTED


class LogView:
    """The driver's view of the subscribed partitions and their watermarks (one AdminClient)."""

    def __init__(self, conf: Mapping[str, str], timeout_s: float = 30.0) -> None:
        self._conf = dict(conf)
        self._timeout = timeout_s
        self._admin: Any = None
        self._missing: set[str] = set()

    def _client(self) -> Any:
        if self._admin is None:
            from confluent_kafka.admin import AdminClient

            admin_conf: dict[str, Any] = {
                k: v for k, v in self._conf.items() if k not in ("isolation.level", "group.id")
            }
            self._admin = AdminClient(admin_conf)
        return self._admin

    def partitions(self, topics: Iterable[str]) -> list[TopicPartitionKey]:
        """The partitions of ``topics`` now; a topic that does not exist (yet) has none."""
        out: list[TopicPartitionKey] = []
        for topic in topics:
            meta = self._client().list_topics(topic=topic, timeout=self._timeout).topics.get(topic)
            if meta is None or meta.error is not None:
                if topic not in self._missing:  # once, not on every trigger
                    self._missing.add(topic)
                    log.warning(
                        "topic %s has no metadata (%s); it has no partitions to read yet",
                        topic,
                        None if meta is None else meta.error,
                    )
                continue
            self._missing.discard(topic)
            out.extend(TopicPartitionKey(topic, p) for p in sorted(meta.partitions))
        return out

    def partitions_matching(self, wanted: Callable[[str], bool]) -> list[TopicPartitionKey]:
        """The partitions of every topic ``wanted`` accepts (subscribePattern); internal topics excluded."""
        meta = self._client().list_topics(timeout=self._timeout)
        out: list[TopicPartitionKey] = []
        for name in sorted(meta.topics):
            topic = meta.topics[name]
            if name.startswith("__") or topic.error is not None or not wanted(name):
                continue
            out.extend(TopicPartitionKey(name, p) for p in sorted(topic.partitions))
        return out

    def bounds(self, keys: Iterable[TopicPartitionKey]) -> dict[TopicPartitionKey, LogBounds]:
        """Log start and log end (last stable offset under read_committed) of each partition."""
        keys = list(keys)
        if not keys:
            return {}
        from confluent_kafka.admin import OffsetSpec  # type: ignore[attr-defined]

        lows = self._list(keys, OffsetSpec.earliest())  # type: ignore[no-untyped-call]
        highs = self._list(keys, OffsetSpec.latest())  # type: ignore[no-untyped-call]
        return {k: LogBounds(min(lows[k], highs[k]), highs[k]) for k in keys}

    def _list(self, keys: list[TopicPartitionKey], spec: Any) -> dict[TopicPartitionKey, int]:
        from confluent_kafka import TopicPartition

        request = {TopicPartition(k.topic, k.partition): spec for k in keys}
        futures = self._client().list_offsets(
            request, isolation_level=_isolation(self._conf), request_timeout=self._timeout
        )
        out: dict[TopicPartitionKey, int] = {}
        for tp, future in futures.items():
            out[TopicPartitionKey(tp.topic, tp.partition)] = int(future.result().offset)
        return out

    def close(self) -> None:
        self._admin = None


# -- reading in tasks --------------------------------------------------------------------------

_CONSUMERS: dict[tuple[tuple[str, str], ...], Any] = {}
_CONSUMERS_LOCK = threading.Lock()


def _merged(conf: Mapping[str, str]) -> dict[str, Any]:
    """The user's ``kafka.*`` settings with the source's read defaults applied LAST: no option may turn
    off the detection of data loss (``auto.offset.reset=error``) or make the reader join a group."""
    return {**RANGE_READ_TUNING, **conf, **RANGE_READ_DEFAULTS}


def _consumer(conf: Mapping[str, str]) -> Any:
    """A consumer for range reads, cached per Python worker process and configuration."""
    merged = _merged(conf)
    key = tuple(sorted((k, str(v)) for k, v in merged.items()))
    with _CONSUMERS_LOCK:
        consumer = _CONSUMERS.get(key)
        if consumer is None:
            consumer = Consumer(merged)
            _CONSUMERS[key] = consumer
        return consumer


def _drop_consumer(conf: Mapping[str, str]) -> None:
    merged = _merged(conf)
    key = tuple(sorted((k, str(v)) for k, v in merged.items()))
    with _CONSUMERS_LOCK:
        consumer = _CONSUMERS.pop(key, None)
    if consumer is not None:
        _close(consumer)


def _close_consumers() -> None:
    """Close every cached range-read consumer (a process that reads ranges in-process, such as a test
    session, calls this when done: a Spark worker keeps its consumers until it exits)."""
    with _CONSUMERS_LOCK:
        consumers = list(_CONSUMERS.values())
        _CONSUMERS.clear()
    for consumer in consumers:
        _close(consumer)


def _close(consumer: Any) -> None:
    try:
        consumer.close()
    except (KafkaException, RuntimeError) as exc:
        log.debug("closing a range-read consumer: %r", exc)


def _arrow_batch(msgs: list[Message], piece: Piece, schema: Any) -> Any:
    """One Arrow batch in the source schema from messages of one piece (column by column: no per-row work
    beyond reading the message fields)."""
    import pyarrow as pa  # type: ignore[import-untyped]

    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    arrays = [
        pa.array([m.key() for m in msgs], type=pa.binary()),
        pa.array([m.value() for m in msgs], type=pa.binary()),
        pa.array([piece.topic] * n, type=pa.string()),
        pa.array([piece.partition] * n, type=pa.int32()),
        pa.array([m.offset() for m in msgs], type=pa.int64()),
        pa.array([None if t == TIMESTAMP_NOT_AVAILABLE else ms * 1000 for t, ms in stamps], type=pa.int64()).cast(
            schema.field("timestamp").type
        ),
        # Kafka's TimestampType ids, as Spark's Kafka source reports them: CreateTime 0, LogAppendTime 1.
        pa.array([t - 1 for t, _ in stamps], type=pa.int32()),
    ]
    if schema.get_field_index("headers") >= 0:
        arrays.append(
            pa.array(
                [[{"key": h[0], "value": h[1]} for h in (m.headers() or [])] for m in msgs],
                type=schema.field("headers").type,
            )
        )
    arrays.append(pa.array([piece.backfill] * n, type=pa.bool_()))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def read_pieces(
    conf: Mapping[str, str],
    pieces: Iterable[Piece],
    arrow_schema: Any,
    *,
    fail_on_data_loss: bool,
    timeout_s: float,
) -> Iterator[Any]:
    """Yield Arrow record batches holding exactly the records of ``pieces``, in piece order.

    Offsets inside a piece with no record (transaction markers, compaction) are
    skipped by following the consumer's position.  Records the log no longer
    has (below its start) raise DataLossError, or are skipped with a warning
    when ``fail_on_data_loss`` is false, as Spark's failOnDataLoss option does.
    """
    consumer = _consumer(conf)
    ok = False
    try:
        for piece in pieces:
            for chunk in _read_piece(consumer, piece, fail_on_data_loss=fail_on_data_loss, timeout_s=timeout_s):
                yield _arrow_batch(chunk, piece, arrow_schema)
        ok = True
    finally:
        try:
            consumer.unassign()
        except (KafkaException, RuntimeError) as exc:
            log.debug("unassign after a range read: %r", exc)
        if not ok:
            # A failed or abandoned read may leave librdkafka state behind: start clean next time.
            _drop_consumer(conf)


def _lost(piece: Piece, start: int, low: int, fail_on_data_loss: bool) -> None:
    message = (
        f"records [{start}, {min(low, piece.end)}) of {piece.topic}[{piece.partition}] are no longer "
        f"in Kafka (log start is {low}); they were deleted (retention) before this batch read them"
    )
    if fail_on_data_loss:
        raise DataLossError(message + ". Set failOnDataLoss=false to skip them and go on.")
    log.warning("%s; skipping them (failOnDataLoss=false)", message)


def _read_piece(consumer: Any, piece: Piece, *, fail_on_data_loss: bool, timeout_s: float) -> Iterator[list[Message]]:
    """The records of ``piece`` in offset order, a list per fetch."""
    tp = TopicPartition(piece.topic, piece.partition)
    start = piece.start
    low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
    if start < low:
        _lost(piece, start, low, fail_on_data_loss)
        start = low
    if start >= piece.end:
        return
    consumer.assign([TopicPartition(piece.topic, piece.partition, start)])
    deadline = time.monotonic() + timeout_s
    position = start
    while position < piece.end:
        if time.monotonic() > deadline:
            raise FastRecoverError(
                f"reading [{piece.start}, {piece.end}) of {piece.topic}[{piece.partition}] made no progress "
                f"for {timeout_s:g} s (stuck at offset {position}, log end was {high})"
            )
        messages = consumer.consume(_CONSUME_BATCH, 0.5)
        progressed = False
        chunk: list[Message] = []
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                if err.code() in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                    low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s, cached=False)
                    if position < low:
                        _lost(piece, position, low, fail_on_data_loss)
                        position = low
                        if position >= piece.end:
                            break
                        consumer.assign([TopicPartition(piece.topic, piece.partition, position)])
                        progressed = True
                        continue
                    raise DataLossError(
                        f"offset {position} of {piece.topic}[{piece.partition}] is out of range "
                        f"(log is [{low}, {high})): {err.str()}"
                    )
                if err.fatal():
                    raise KafkaException(err)
                log.warning("consumer error while reading %s[%d]: %s", piece.topic, piece.partition, err.str())
                continue
            offset = msg.offset()
            if offset is None or offset < position:
                continue
            if offset >= piece.end:
                position = piece.end
                break
            position = offset + 1
            progressed = True
            chunk.append(msg)
        if chunk:
            yield chunk
        if position < piece.end:
            # Control records and compacted-away offsets never arrive as messages:
            # the consumer's position still moves past them.
            (now,) = consumer.position([tp])
            if now.offset is not None and now.offset > position:
                position = now.offset
                progressed = True
        if progressed:
            deadline = time.monotonic() + timeout_s
