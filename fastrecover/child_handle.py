"""The child's librdkafka handle, addressed by partition: the I/O edge of the child.

:class:`~fastrecover.child.ChildReader` decides which range each partition
reads and from where; this class only carries those decisions to the second
``confluent_kafka.Consumer``, which never joins the group (``assign()`` only,
incremental) and never commits.  Keeping the client calls here leaves the
reader's range bookkeeping readable, and testable with a fake client.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from confluent_kafka import KafkaException, Message, TopicPartition

from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.child")

#: librdkafka's own ceiling on one consume() call
_MAX_CONSUME = 100_000


class ChildHandle:
    """One child ``confluent_kafka.Consumer`` at a time, created on demand and replaced after a failure."""

    def __init__(
        self, conf: dict[str, Any], *, broker_timeout_s: float, factory: Callable[[dict[str, Any]], Any]
    ) -> None:
        self._conf = dict(conf)
        self._timeout = broker_timeout_s
        self._factory = factory
        self._consumer: Any = None
        #: handles created over the reader's life (the first one and every replacement)
        self.created = 0

    @property
    def is_open(self) -> bool:
        return self._consumer is not None

    def open(self) -> None:
        """A new handle, closing the current one (a failed handle is never reused)."""
        if self._consumer is not None:
            self.close()
        self._consumer = self._factory(self._conf)
        self.created += 1

    def adopt(self, consumer: Any) -> None:
        """Take ``consumer``, made from this handle's configuration, as the current handle."""
        if self._consumer is not None:
            self.close()
        self._consumer = consumer
        self.created += 1

    def close(self) -> None:
        """Close explicitly: a handle left to the garbage collector may block in librdkafka's destroy."""
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing child consumer: %r", exc)

    def set_credentials(self, username: str, password: str) -> None:
        """Keep SASL credentials for this handle and every later one."""
        self._conf["sasl.username"], self._conf["sasl.password"] = username, password
        if self._consumer is not None:
            self._consumer.set_sasl_credentials(username, password)

    def consume(self, count: int, wait: float) -> list[Message]:
        """Up to ``count`` records (and error events); raises whatever the client raises."""
        return self._consumer.consume(min(count, _MAX_CONSUME), wait)  # type: ignore[no-any-return]

    def positions(self, keys: list[TopicPartitionKey]) -> list[int] | None:
        """The fetch positions of ``keys``, or None when the client cannot tell now."""
        try:
            tps = self._consumer.position([TopicPartition(k.topic, k.partition) for k in keys])
        except KafkaException:
            return None
        return [int(tp.offset) for tp in tps]

    def low_watermark(self, key: TopicPartitionKey) -> int | None:
        """The partition's log start (what retention left), or None when the broker does not answer."""
        try:
            low, _high = self._consumer.get_watermark_offsets(
                TopicPartition(key.topic, key.partition), timeout=self._timeout
            )
            return int(low)
        except KafkaException as exc:
            log.debug("watermarks of %s unavailable (%s); reading from the cursor", key, exc)
            return None

    def cluster_id(self, topic: str) -> str | None:
        """The cluster's id from a metadata request for ``topic``; None when the broker does not answer.

        Asked of this handle, not the primary's: librdkafka aborts on a metadata request made
        inside a KIP-848 rebalance callback, where recovery runs.
        """
        try:
            metadata = self._consumer.list_topics(topic, timeout=self._timeout)
        except KafkaException as exc:
            log.debug("cluster id unavailable: %s", exc)
            return None
        cluster: str | None = metadata.cluster_id
        return cluster

    def assigned(self) -> set[tuple[str, int]]:
        """The partitions the handle fetches now, as ``(topic, partition)`` (equal to their keys)."""
        return {(t.topic, t.partition) for t in self._consumer.assignment()}

    def is_assigned(self, key: TopicPartitionKey) -> bool:
        return key in self.assigned()

    def seek(self, key: TopicPartitionKey, offset: int) -> None:
        """Move the fetcher; raises KafkaException while the partition is not fetching yet."""
        self._consumer.seek(TopicPartition(key.topic, key.partition, offset))

    def place(self, key: TopicPartitionKey, offset: int, assigned: bool | None) -> bool:
        """Seek a fetching partition to ``offset``; False when it must be assigned afresh (:meth:`assign`).

        ``assigned`` None asks the handle.  A partition assigned but not fetching yet refuses the
        seek: it is unassigned here, to be assigned again at ``offset``.
        """
        if assigned is None:
            assigned = self.is_assigned(key)
        if not assigned:
            return False
        try:
            self.seek(key, offset)
            return True
        except KafkaException:
            self.unassign([key])
            return False

    def assign(self, starts: list[tuple[TopicPartitionKey, int]], paused: Collection[TopicPartitionKey]) -> None:
        """Start fetching each partition at its offset, in one call; those in ``paused`` stay paused.

        One ``incremental_assign`` for them all: each call costs librdkafka time in the size of the
        whole assignment, so a partition at a time grows quadratically (seconds at 2,048 partitions).
        """
        if not starts:
            return
        self._consumer.incremental_assign([TopicPartition(k.topic, k.partition, offset) for k, offset in starts])
        held = [TopicPartition(k.topic, k.partition) for k, _ in starts if k in paused]
        if held:
            self._consumer.pause(held)

    def unassign(self, keys: Iterable[TopicPartitionKey]) -> None:
        if self._consumer is None:
            return
        wanted = {(k.topic, k.partition) for k in keys}
        tps = [tp for tp in self._consumer.assignment() if (tp.topic, tp.partition) in wanted]
        if tps:
            self._consumer.incremental_unassign(tps)

    def set_paused(self, keys: Iterable[TopicPartitionKey], paused: bool) -> None:
        wanted = {(k.topic, k.partition) for k in keys}
        tps = [
            TopicPartition(t.topic, t.partition)
            for t in self._consumer.assignment()
            if (t.topic, t.partition) in wanted
        ]
        if tps:
            (self._consumer.pause if paused else self._consumer.resume)(tps)
