"""What the first recovery asks the broker, asked on the child's handle while the group join runs.

A restarted consumer's first recovery reads the cluster's id (its ranges' lineage) and the log
ends of its partitions before it decides.  Asked at the assignment, the cluster id on the child's
still unconnected handle took 2-50 ms (a connection, and librdkafka's wait after it replaces the
bootstrap connection), and the log ends a round trip.  ``subscribe()`` knows the topics before the
join: a thread asks both then, on the child's handle, while the caller's thread imports the mode
(:mod:`fastrecover.startup`).  The thread owns that handle until it ends, and the mode is built
only after that (:meth:`Lookahead.settle`), so the handle is never used by two threads at once.
Its calls have a short timeout of their own: ``subscribe()`` waits for them, and a broker that
does not answer leaves the recovery to ask as before.

What may rest on the answers (:mod:`fastrecover.recovery_reads`): the cluster id, always; the log
ends, only for a recovery that replays from the committed offsets, and only when read at most
:data:`MAX_AGE_S` ago.  A log end read earlier can only be lower than the current one: the lag
looks smaller, which may make a recovery replay a little more (slower), never skip a record.  A
recovery that jumps starts the primary at the log end, so it reads that afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

log = logging.getLogger("fastrecover.recovery")

#: the ListOffsets timestamp that asks for a partition's log end (Kafka's LATEST_TIMESTAMP)
_LATEST = -1
#: the broker timeout of each of the thread's two requests: subscribe() waits for them
_TIMEOUT_S = 0.25
#: a recovery may replay on log ends read at most this long ago (a dynamic member's join may take the
#: dead member's whole session: log ends read that long before would make a large lag look small)
MAX_AGE_S = 1.0
#: more literal topics than this are left to the recovery (one metadata request per topic)
_MAX_TOPICS = 8


class Lookahead:
    """The cluster id and the subscribed topics' log ends, read on a thread during the join."""

    def __init__(self, handle: Any, topics: Sequence[str]) -> None:
        #: the cluster's id; None until read (or when the broker did not say)
        self.cluster_id: str | None = None
        #: (topic, partition) -> log end: plain tuples, equal to the TopicPartitionKey the recovery asks with
        #: (imported with the consumer, this module leaves the mode's value types to the mode's import)
        self._log_ends: dict[tuple[str, int], int] = {}
        #: when the log ends were asked for (monotonic), 0.0 when they were not read
        self._asked_at = 0.0
        literal = [t for t in topics if not t.startswith("^")]
        self._done = threading.Event()
        if not literal or len(literal) > _MAX_TOPICS:
            self._done.set()
            return
        threading.Thread(target=self._run, args=(handle, literal), name="fastrecover-lookahead", daemon=True).start()

    def _run(self, handle: Any, topics: list[str]) -> None:
        try:
            wanted: list[TopicPartition] = []
            for topic in topics:
                metadata = handle.list_topics(topic, timeout=_TIMEOUT_S)
                self.cluster_id = self.cluster_id or metadata.cluster_id
                found = metadata.topics.get(topic)
                if found is not None and found.error is None:
                    wanted += [TopicPartition(topic, p, _LATEST) for p in found.partitions]
            if not wanted:
                return
            asked_at = time.monotonic()
            answered = handle.offsets_for_times(wanted, timeout=_TIMEOUT_S)
            self._log_ends = {
                (tp.topic, tp.partition): int(tp.offset) for tp in answered if tp.error is None and tp.offset >= 0
            }
            self._asked_at = asked_at
        except (KafkaException, RuntimeError) as exc:  # the recovery asks for itself
            log.debug("reading ahead of the join: %r", exc)
        finally:
            self._done.set()

    def settle(self) -> None:
        """Until the thread has ended: from then on the child's handle is the caller's alone."""
        self._done.wait()

    def log_ends(self, keys: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int] | None:
        """The log ends of ``keys`` if all were read at most :data:`MAX_AGE_S` ago; given out once."""
        ends, asked_at = self._log_ends, self._asked_at
        self._log_ends, self._asked_at = {}, 0.0
        if not asked_at or time.monotonic() - asked_at > MAX_AGE_S or any(k not in ends for k in keys):
            return None
        return {k: ends[k] for k in keys}
