"""The sequenced producer of the fault campaign, and reading the topic back for the checker.

:class:`SequencedProducer` writes records round-robin over every partition of
the given topics at a steady rate, for as long as it runs.  Each record's value
(and key) is its per-partition sequence number; its timestamp is the produce
time.  Every record the broker *acknowledges* is appended to a log file
(``topic partition offset seq produced_ms``) from the delivery report: that
file, not what we tried to send, is what the checker holds the consumers to.
The producer is idempotent with ``acks=all``, so a broker restart neither
loses nor duplicates an acknowledged record.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

log = logging.getLogger("fastrecover_tools.chaos")

_TICK_S = 0.01


class SequencedProducer:
    """Produce ``rate`` records/s over ``topics`` x ``partitions`` in a background thread."""

    def __init__(
        self,
        bootstrap: str,
        topics: Sequence[str],
        partitions: int,
        rate: float,
        log_path: Path,
        *,
        config: dict[str, Any] | None = None,
    ) -> None:
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate!r}")
        self.topics = list(topics)
        self.partitions = partitions
        self.rate = rate
        self.log_path = log_path
        self._conf = {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "message.timeout.ms": 300_000,
            **(config or {}),
        }
        self._counts = {t: partitions for t in self.topics}
        self._flush_timeout = 120.0
        self._stop = threading.Event()
        self._pause = threading.Event()
        self._paused = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self._lock = threading.Lock()
        self.sent = 0
        self.acked = 0
        self.failed = 0
        self.errors: list[str] = []
        self._seq: dict[tuple[str, int], int] = {}
        self._index = 0

    def __enter__(self) -> SequencedProducer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._thread.start()

    def stop(self, flush_timeout: float = 120.0) -> None:
        """Stop producing and wait until every sent record is acknowledged (or failed)."""
        self._flush_timeout = flush_timeout
        self._stop.set()
        self._thread.join(flush_timeout + 10)
        if self._thread.is_alive():
            raise TimeoutError(f"producer did not flush within {flush_timeout:g} s")

    def pause(self, timeout: float = 120.0) -> None:
        """Stop producing until :meth:`resume`, once every sent record is acknowledged (or failed).

        The producer itself is closed: an operator about to delete a topic must not leave
        records in flight to it, and the idempotent producer's sequence numbers for its
        partitions must not outlive it.
        """
        self._pause.set()
        if not self._paused.wait(timeout):
            raise TimeoutError(f"producer did not pause within {timeout:g} s")

    def resume(self) -> None:
        self._paused.clear()
        self._pause.clear()

    def set_partitions(self, topic: str, count: int) -> None:
        """``topic`` has ``count`` partitions now: produce to every one of them."""
        with self._lock:
            self._counts[topic] = count

    def _targets(self) -> list[tuple[str, int]]:
        with self._lock:
            return [(t, p) for t in self.topics for p in range(self._counts[t])]

    def _run(self) -> None:
        began = time.monotonic()
        with open(self.log_path, "a", buffering=1, encoding="utf-8") as out:

            def report(err: Any, msg: Any) -> None:
                if err is not None:
                    with self._lock:
                        self.failed += 1
                        if len(self.errors) < 20:
                            self.errors.append(str(err))
                    return
                _ts_type, ts = msg.timestamp()
                out.write(f"{msg.topic()} {msg.partition()} {msg.offset()} {int(msg.key())} {ts}\n")
                with self._lock:
                    self.acked += 1

            while not self._stop.is_set():
                producer = Producer(self._conf)
                began = self._produce(producer, report, began)
                remaining = producer.flush(self._flush_timeout)
                if remaining:
                    log.error("producer: %d records still unacknowledged at the end", remaining)
                del producer
                if self._stop.is_set():
                    break
                self._paused.set()
                while self._pause.is_set() and not self._stop.is_set():
                    time.sleep(_TICK_S)
                began = time.monotonic() - self.sent / self.rate  # no burst to make up for the pause
        log.info("producer: %d sent, %d acknowledged, %d failed", self.sent, self.acked, self.failed)

    def _produce(self, producer: Producer, report: Any, began: float) -> float:
        """Produce at the rate until stopped or paused; returns the rate's time origin."""
        while not self._stop.is_set() and not self._pause.is_set():
            targets = self._targets()
            due = int((time.monotonic() - began) * self.rate) - self.sent
            for _ in range(max(0, due)):
                topic, partition = targets[self._index % len(targets)]
                seq = self._seq.get((topic, partition), 0)
                try:
                    producer.produce(
                        topic,
                        value=str(seq).encode(),
                        key=str(seq).encode(),
                        partition=partition,
                        on_delivery=report,
                    )
                except BufferError:
                    break  # local queue full (broker away): try again next tick
                except KafkaException as exc:
                    if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                        raise
                    # partitions were just added: the producer's metadata does not show them yet
                    producer.list_topics(topic, timeout=10)
                    break
                self._index += 1
                self._seq[(topic, partition)] = seq + 1
                self.sent += 1
            producer.poll(_TICK_S)
        return began


def read_topic(
    bootstrap: str, topics: Sequence[str], partitions: int | Mapping[str, int], timeout: float = 120.0
) -> tuple[dict[tuple[str, int], int], set[tuple[str, int, int]]]:
    """Low watermark of every partition and every (topic, partition, offset) the topics still hold.

    ``partitions`` is every topic's count, or a count per topic (partitions were added).
    """
    counts = {t: partitions for t in topics} if isinstance(partitions, int) else dict(partitions)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "fastrecover-chaos-checker",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        lows: dict[tuple[str, int], int] = {}
        highs: dict[tuple[str, int], int] = {}
        assign = []
        for t in topics:
            for p in range(counts[t]):
                low, high = consumer.get_watermark_offsets(TopicPartition(t, p), timeout=30)
                lows[(t, p)], highs[(t, p)] = low, high
                if high > low:
                    assign.append(TopicPartition(t, p, low))
        present: set[tuple[str, int, int]] = set()
        pending = {(tp.topic, tp.partition) for tp in assign}
        if assign:
            consumer.assign(assign)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading the topic back: partitions {sorted(pending)} not read to the end")
            for msg in consumer.consume(1000, 0.5):
                key = (msg.topic() or "", msg.partition() or 0)
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if (msg.offset() or 0) >= highs[key]:
                            pending.discard(key)
                        continue
                    raise RuntimeError(f"reading {key} back: {err}")
                present.add((key[0], key[1], msg.offset() or 0))
                if (msg.offset() or 0) + 1 >= highs[key]:
                    pending.discard(key)
        return lows, present
    finally:
        consumer.close()
