"""The operator of the fault campaign: what people do to a consumer group besides crashing it.

Each action is what an operator runs against Kafka or the store, done the way
they do it (Kafka's admin API with no commit metadata, as ``kafka-consumer-groups``
does; a store restored row for row from a backup).  Actions that Kafka refuses
for a group with live members run with every member stopped; the driver does
that (:meth:`fastrecover_tools.chaos.driver.ChaosDriver.operator_act`).  Each
returns the :mod:`~fastrecover_tools.chaos.checker` effects it has on what the
group owes, which the drain waits for and the verdict checks.

Not here: two Kafka clusters sharing one store needs a second broker; it has
its real-broker test (``tests/integration/test_operator_actions.py``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import ConsumerGroupTopicPartitions, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions

from fastrecover.codec import read_marker
from fastrecover.store import open_store
from fastrecover.store.models import RANGES
from fastrecover_tools.chaos.checker import Effect, Recreated, Reread, Skipped, StoreRestored
from fastrecover_tools.testing.broker import create_topic, delete_topic

log = logging.getLogger("fastrecover_tools.chaos")

#: the actions `fastrecover chaos --operator-actions` draws from
ACTIONS = (
    "reset-earliest",
    "reset-datetime",
    "shift-back",
    "shift-forward",
    "recreate-topic",
    "add-partitions",
    "delete-group",
    "restore-store",
    "sync-from-replica",
)
#: actions that need the group empty (Kafka refuses them, or an operator stops the application first)
NEEDS_STOP = frozenset(ACTIONS) - {"add-partitions"}
_TIMEOUT_S = 30.0
#: the cluster ``sync-from-replica`` says the offsets come from (its markers name it)
SOURCE_CLUSTER = "chaos-source-cluster"


def _now_ms() -> int:
    return int(time.time() * 1000)


class Operator:
    """Acts on one group's topics and store; keeps the store backup a later restore goes back to."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Sequence[str],
        partitions: dict[str, int],
        store_url: str,
        rng: random.Random,
        *,
        max_partitions: int,
        on_partitions: Callable[[str, int], None] = lambda topic, count: None,
    ) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topics = list(topics)
        self.partitions = partitions  # shared with the driver: partitions added show up there
        self.store_url = store_url
        self.rng = rng
        self.max_partitions = max_partitions
        self.on_partitions = on_partitions
        self.effects: list[Effect] = []
        self.done: list[str] = []
        self._backup: list[dict[str, Any]] | None = None
        self._admin = AdminClient({"bootstrap.servers": bootstrap})

    # ---- the actions -----------------------------------------------------------------------------

    def act(self, action: str) -> str:
        """Carry ``action`` out (members stopped when it :data:`NEEDS_STOP`); return what was done."""
        handler = getattr(self, "_" + action.replace("-", "_"))
        what: str = handler()
        self.done.append(f"{action}: {what}")
        log.info("operator: %s: %s", action, what)
        return what

    def backup(self) -> None:
        """Copy the group's rows of the store (the backup a later ``restore-store`` goes back to)."""
        with open_store(self.store_url) as store, store.engine.connect() as conn:
            rows = conn.execute(sa.select(RANGES).where(RANGES.c.group_id == self.group)).mappings().all()
        self._backup = [dict(r) for r in rows]

    def _restore_store(self) -> str:
        if self._backup is None:
            self.backup()
            return "no backup yet: took one"
        rows = self._backup
        with open_store(self.store_url) as store, store.engine.begin() as conn:
            conn.execute(sa.delete(RANGES).where(RANGES.c.group_id == self.group))
            if rows:
                conn.execute(sa.insert(RANGES), rows)
        self.effects.append(StoreRestored(_now_ms()))
        return f"{len(rows)} rows back from the older backup"

    def _reset(self, topic: str, target: Callable[[TopicPartition, int, int, int | None], int | None]) -> str:
        """Alter the group's offsets of ``topic`` to ``target(tp, low, high, committed)`` (None: leave it)."""
        at = _now_ms()
        committed = self._committed(topic)
        moved: list[TopicPartition] = []
        bounds: dict[int, tuple[int, int, int | None]] = {}
        for p, (low, high) in self._watermarks(topic).items():
            c = committed.get(p)
            new = target(TopicPartition(topic, p), low, high, c)
            if new is None:
                continue
            new = max(low, min(high, new))
            moved.append(TopicPartition(topic, p, new))
            bounds[p] = (new, high, c)
        if not moved:
            return f"{topic}: no partition to move"
        request = ConsumerGroupTopicPartitions(self.group, moved)
        (future,) = self._admin.alter_consumer_group_offsets([request], request_timeout=_TIMEOUT_S).values()
        future.result(timeout=_TIMEOUT_S)
        for p, (new, high, c) in bounds.items():
            if new < high:
                self.effects.append(Reread(topic, p, new, high, at))
            if c is not None and new > c:
                self.effects.append(Skipped(topic, p, c, new, at))
        return f"{topic} to " + ", ".join(f"[{tp.partition}]={tp.offset}" for tp in moved)

    def _reset_earliest(self) -> str:
        return self._reset(self._topic(), lambda tp, low, high, c: low)

    def _shift_back(self) -> str:
        shift = self.rng.randint(1, 500)
        return self._reset(self._topic(), lambda tp, low, high, c: None if c is None else c - shift) + f" (-{shift})"

    def _shift_forward(self) -> str:
        shift = self.rng.randint(1, 100)
        return self._reset(self._topic(), lambda tp, low, high, c: None if c is None else c + shift) + f" (+{shift})"

    def _reset_datetime(self) -> str:
        topic = self._topic()
        # a time within the last minute: before some of the records, after others
        back = self.rng.randint(0, 60_000)
        found = self._offsets_for_times(topic, _now_ms() - back)
        return self._reset(topic, lambda tp, low, high, c: found.get(tp.partition, high)) + f" (now - {back} ms)"

    def _delete_group(self) -> str:
        at = _now_ms()
        ends = {(t, p): bounds for t in self.topics for p, bounds in self._watermarks(t).items()}
        (future,) = self._admin.delete_consumer_groups([self.group], request_timeout=_TIMEOUT_S).values()
        try:
            future.result(timeout=_TIMEOUT_S)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
                raise
        for (t, p), (low, high) in ends.items():
            if low < high:  # the workers start from auto.offset.reset=earliest
                self.effects.append(Reread(t, p, low, high, at))
        return f"{self.group} deleted"

    def _sync_from_replica(self) -> str:
        """One topic's offsets as MirrorMaker 2's offset sync leaves them on a replica after a failover.

        The offset sync commits the source's offset (translated) with the metadata the source committed,
        whose marker names the source cluster.  The records here are this cluster's own, at the same
        offsets: each offset is committed again, its marker naming another cluster.  A partition whose
        marker listed unfinished ranges must be read again from its log start: nothing here can tell
        where the source's ranges lie.
        """
        topic = self._topic()
        at = _now_ms()
        lows = self._watermarks(topic)
        moved: list[TopicPartition] = []
        for p, (offset, metadata) in self._committed_metadata(topic).items():
            marker = read_marker(metadata)
            if marker is None or marker.lineage is None or metadata is None:
                continue
            nonce = marker.lineage.rpartition("/")[2]
            copied = metadata.replace(marker.lineage, f"{SOURCE_CLUSTER}/{nonce}", 1)
            moved.append(TopicPartition(topic, p, offset, metadata=copied))
            low, high = lows[p]
            if marker.ranges and low < high:
                self.effects.append(Reread(topic, p, low, high, at))
        if not moved:
            return f"{topic}: no offset with a marker to sync"
        request = ConsumerGroupTopicPartitions(self.group, moved)
        (future,) = self._admin.alter_consumer_group_offsets([request], request_timeout=_TIMEOUT_S).values()
        future.result(timeout=_TIMEOUT_S)
        return f"{topic}: " + ", ".join(f"[{tp.partition}]={tp.offset}" for tp in moved)

    def _recreate_topic(self) -> str:
        """Delete and create ``topic`` again (the producer is paused by the driver around it)."""
        topic = self._topic()
        count = self.partitions[topic]
        at = _now_ms()
        delete_topic(self.bootstrap, topic, timeout=60)
        self.effects.append(Recreated(topic, at))
        create_topic(self.bootstrap, topic, count, timeout=60)
        return f"{topic} ({count} partitions)"

    def _add_partitions(self) -> str:
        candidates = [t for t in self.topics if self.partitions[t] < self.max_partitions]
        if not candidates:
            return "every topic at its most partitions already"
        topic = self.rng.choice(candidates)
        count = min(self.max_partitions, self.partitions[topic] + self.rng.randint(1, 2))
        (future,) = self._admin.create_partitions([NewPartitions(topic, count)], request_timeout=_TIMEOUT_S).values()
        future.result(timeout=_TIMEOUT_S)
        self.partitions[topic] = count
        self.on_partitions(topic, count)
        return f"{topic} to {count} partitions"

    # ---- Kafka ---------------------------------------------------------------------------------

    def _topic(self) -> str:
        return self.rng.choice(self.topics)

    def _committed(self, topic: str) -> dict[int, int]:
        return {p: offset for p, (offset, _) in self._committed_metadata(topic).items()}

    def _committed_metadata(self, topic: str) -> dict[int, tuple[int, str | None]]:
        """Each committed offset of ``topic`` with the metadata committed with it."""
        request = ConsumerGroupTopicPartitions(
            self.group, [TopicPartition(topic, p) for p in range(self.partitions[topic])]
        )
        (future,) = self._admin.list_consumer_group_offsets([request], request_timeout=_TIMEOUT_S).values()
        answer = future.result(timeout=_TIMEOUT_S)
        return {
            tp.partition: (tp.offset, tp.metadata)
            for tp in answer.topic_partitions or []
            if tp.offset >= 0 and tp.error is None
        }

    def _probe(self) -> PlainConsumer:
        return PlainConsumer({"bootstrap.servers": self.bootstrap, "group.id": f"{self.group}-operator"})

    def _watermarks(self, topic: str) -> dict[int, tuple[int, int]]:
        probe = self._probe()
        try:
            out = {}
            for p in range(self.partitions[topic]):
                low, high = probe.get_watermark_offsets(TopicPartition(topic, p), timeout=_TIMEOUT_S)
                out[p] = (int(low), int(high))
            return out
        finally:
            probe.close()

    def _offsets_for_times(self, topic: str, stamp: int) -> dict[int, int]:
        probe = self._probe()
        try:
            found = probe.offsets_for_times(
                [TopicPartition(topic, p, stamp) for p in range(self.partitions[topic])], timeout=_TIMEOUT_S
            )
            return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
        finally:
            probe.close()
