"""``fastrecover.Consumer``: a ``confluent_kafka.Consumer`` with KIP-333 parallel rebalance.

It *is* a ``confluent_kafka.Consumer`` (a subclass): ``isinstance`` holds, the
application's object is what rebalance callbacks receive, and a subclass's
overrides run.  With the mode off an instance of this class gets librdkafka's
own methods, untouched (see :class:`_PlainMode`).  With it on, the methods the
KIP changes delegate to :class:`~fastrecover.parallel.ParallelMode`, built at
the first call that needs it (``_PendingConsumer`` until then: startup.py); every
other method is the primary's own.  Arguments a fast path does not recognise
are handed to confluent_kafka's own method, so a wrong argument fails exactly
as it does there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Message, TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover._accel import fast_offsets, fast_poll
from fastrecover.config import mode_requested, parse_bool, split_config
from fastrecover.held import held_callbacks
from fastrecover.startup import PendingMode, advise_static_membership, built_mode, child_handle, pending_class
from fastrecover.steady import FAST_CALLS, IDLE_SLICE_S, SteadyGate
from fastrecover.steady import poll as _steady_poll

if TYPE_CHECKING:
    from fastrecover.metrics import ConsumerMetrics
    from fastrecover.parallel import ParallelMode
    from fastrecover.ranges import RangeProgress
    from fastrecover.recoverer import RecoveryReport
    from fastrecover.tokens import Token

__all__ = ["Consumer", "RecoveryReport"]

_K = _KafkaConsumer
_NUMBER = (int, float)
#: the mode-on primary's fetch.queue.backoff.ms unless the application sets it (the child's too: config.py).
#: A late jump seeks a primary whose queue a replay filled; librdkafka keeps its fetches backed off that long
#: after the seek (1 s by default), and the first fresh records of a 1M-lag restart waited 0.45 s for it.
PRIMARY_FETCH_QUEUE_BACKOFF_MS = 20
#: librdkafka's own words when store_offsets() is called with enable.auto.offset.store=true
_STORE_WITH_AUTO_STORE = "StoreOffsets failed: Local: Invalid argument or configuration"


class Consumer(_KafkaConsumer):  # type: ignore[misc]
    """A drop-in ``confluent_kafka.Consumer`` that recovers from a crash without lag.

    Pass ``"enable.parallel.rebalance": True`` (or ``enable_parallel_rebalance=True``)
    to turn KIP-333 on; ``fastrecover.*`` keys configure it (docs/configuration.md);
    every other property goes to librdkafka unchanged.  docs/explanation/differences.md lists each
    difference from ``confluent_kafka.Consumer`` in this mode, with its reason.
    """

    _fr: ParallelMode | None = None
    #: the steady gate of ``_fr``: Consumer.poll's steady path (fastrecover/steady.py, and its C copy) reads it
    _gate: SteadyGate | None = None
    #: what ``_fr`` is built from, until the first call that needs it (fastrecover/startup.py)
    _pending: PendingMode | None = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Consumer:
        if cls is Consumer:
            cls = _PendingConsumer if mode_requested(args, kwargs) else _PlainMode
        return _K.__new__(cls)  # type: ignore[no-any-return]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not args and not kwargs:
            raise TypeError("expected configuration dict")  # confluent_kafka's words for a missing config
        if args and (len(args) > 1 or not isinstance(args[0], dict)):
            super().__init__(*args, **kwargs)  # confluent_kafka's own error for a bad config
            return
        conf, settings = split_config(args[0] if args else {}, **kwargs)
        if not settings.enabled:
            super().__init__(conf)
            if type(self) is _PendingConsumer:  # off once the keys are read in full: the mode-off methods
                self.__class__ = _PlainMode
            return
        child = child_handle(conf, settings)  # before the primary, or None: made when first needed
        primary_conf, held = held_callbacks(conf)  # what they raise waits for the next call (held.py)
        if parse_bool("enable.auto.offset.store", conf.get("enable.auto.offset.store", True)):
            # We store the primary's offsets ourselves, one call late and with the range mirror:
            # a record counts as done once the application comes back for more.
            primary_conf["enable.auto.offset.store"] = False
        primary_conf.setdefault("fetch.queue.backoff.ms", PRIMARY_FETCH_QUEUE_BACKOFF_MS)  # see the constant
        try:
            super().__init__(primary_conf)
            advise_static_membership(conf)
            self._pending = PendingMode(conf, settings, child, held)
            if type(self) is not _PendingConsumer or not settings.defers_store_open:  # built now: startup.py says why
                self._build_mode()
        except BaseException:
            if child is not None:
                child.close()
            raise

    def _build_mode(self) -> ParallelMode:
        """Build the mode in the caller's thread, importing its modules first if they are not yet (startup.py)."""
        pending = self._pending
        if pending is None:
            raise RuntimeError("Consumer closed")  # confluent_kafka's words for a closed consumer
        self._fr = fr = pending.build(self)
        self._gate = fr.gate
        self._pending = None
        if type(self) is _PendingConsumer:
            self.__class__ = Consumer
        return fr

    # ---- KIP-333 additions -----------------------------------------------------------------

    def child_consumer_is_alive(self) -> bool:
        """True while the standby child consumer exists and is healthy (the KIP's childConsumerIsAlive())."""
        return self._fr is not None and self._fr.child.is_alive()

    @property
    def parallel_rebalance_enabled(self) -> bool:
        """True when ``enable.parallel.rebalance`` is on and the consumer is not closed."""
        return self._fr is not None

    def backfill_progress(self) -> list[tuple[Token, RangeProgress]]:
        """Held ranges: the durable token and the progress committed since (possibly not yet written)."""
        return self._fr.backfill_progress() if self._fr is not None else []

    @property
    def recoveries(self) -> list[RecoveryReport]:
        """What recovery did for each partition it handled, oldest first."""
        return self._fr.recoverer.reports if self._fr is not None else []

    @property
    def children_started(self) -> int:
        """Child handles created so far (the first one and every replacement)."""
        return self._fr.child.handles_created if self._fr is not None else 0

    @property
    def child_restarts(self) -> int:
        """Child handles replaced after a failure (each resumes from the ranges' progress)."""
        return self._fr.child_restarts if self._fr is not None else 0

    def metrics(self) -> ConsumerMetrics:
        """A snapshot for operators: ranges, backfill left, both streams, child health, store commits.

        Returns:
            A :class:`~fastrecover.metrics.ConsumerMetrics` of plain data.  With the mode
            off (or after ``close()``) only ``parallel_rebalance=False`` is set: nothing is counted.
        """
        return self._fr.metrics() if self._fr is not None else _metrics_off()

    # ---- records ---------------------------------------------------------------------------

    #: the steady path inlined (fastrecover/steady.py: it reads and writes the gate's counters)
    poll = _steady_poll

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]:
        """Up to ``num_messages`` records; with the mode on, both streams share the batch.

        Returns:
            A list of ``Message`` (records and events), empty on timeout; as :meth:`poll` for order.
        Raises:
            ValueError / KafkaException for bad arguments or a failed consumer, as plain.
        """
        fr = self._fr or built_mode(self)
        if (
            fr is None
            or type(num_messages) is not int
            or not 1 <= num_messages <= 1_000_000
            or type(timeout) not in _NUMBER
        ):
            msgs = _K.consume(self, num_messages, timeout)
            return msgs if fr is None else fr.note_batch(msgs)
        return fr.consume(num_messages, timeout)

    # ---- commits ---------------------------------------------------------------------------

    @fast_offsets(_K.commit, "commit")  # its steady case in C when the extension is built (fastrecover/_accel.py)
    def commit(  # type: ignore[override]
        self, message: Message | None = None, offsets: list[TopicPartition] | None = None, asynchronous: bool = True
    ) -> list[TopicPartition] | None:
        """Commit to the two commit logs: offsets inside a backfill range go to the store, the rest to Kafka.

        Returns:
            None when asynchronous; synchronous: the committed partitions, plus one
            ``TopicPartition`` per range written to the store.
        Raises:
            KafkaException as plain (``_NO_OFFSET`` when nothing is stored); with the mode on a
            synchronous commit may also raise ``StoreUnavailableError`` or ``FencedError``.
        """
        fr = self._fr or built_mode(self)
        if fr is not None and offsets is None and message is not None:
            partitions = fr.partitions
            if not partitions.owned:
                # no range, mirror or floor on any partition (the steady state): plain's own commit, which
                # also gives plain's answer to a wrongly typed or errored message (no check of ours first)
                return _K.commit(self, message=message, asynchronous=asynchronous)  # type: ignore[call-overload,no-any-return]
            if type(message) is Message and message.error() is None:
                key = (message.topic(), message.partition())
                if key in partitions.routes:
                    if asynchronous is True:
                        fr.router.defer_commit(key, message.offset())  # type: ignore[arg-type]  # routed at the next tick
                        return None
                elif not partitions.owns(key):  # nothing of ours on this partition: plain's own commit
                    return _K.commit(self, message=message, asynchronous=asynchronous)  # type: ignore[call-overload,no-any-return]
        if fr is None or (
            message is not None and (offsets is not None or type(message) is not Message or message.error() is not None)
        ):
            return _K.commit(self, **_present(message=message, offsets=offsets), asynchronous=asynchronous)  # type: ignore[call-overload,no-any-return]
        if offsets is not None and not _tp_list(offsets):
            return _K.commit(self, offsets=offsets, asynchronous=asynchronous)  # type: ignore[call-overload,no-any-return]
        return fr.commit(message, offsets, bool(asynchronous))

    @fast_offsets(_K.store_offsets, "store_offsets")
    def store_offsets(self, message: Message | None = None, offsets: list[TopicPartition] | None = None) -> None:
        """Store offsets for the next offset-less or automatic commit, routed like :meth:`commit`.

        Raises:
            KafkaException: as plain, e.g. ``_INVALID_ARG`` with ``enable.auto.offset.store=true``.
        """
        fr = self._fr or built_mode(self)
        # one record at a time, and often per record: the common cases first, each test once
        if fr is not None and offsets is None and message is not None and not fr.auto_store:
            partitions = fr.partitions
            if not partitions.owned:
                # nothing of ours anywhere (the steady state): plain's own call, and so plain's answer to a
                # wrongly typed or errored record, with no check of ours first
                _K.store_offsets(self, message=message)
                return
            if type(message) is Message and message.error() is None:
                key = (message.topic(), message.partition())
                if key in partitions.routes:
                    fr.router.defer_store(key, message.offset())  # type: ignore[arg-type]  # routed at the next tick
                    return
                if not partitions.owns(key):
                    _K.store_offsets(self, message=message)  # nothing of ours on this partition
                    return
                fr.store_offsets(message, None)
                return
        if (
            fr is None
            or (message is None) == (offsets is None)
            or (message is not None and (type(message) is not Message or message.error() is not None))
            or (offsets is not None and not _tp_list(offsets))
        ):
            _K.store_offsets(self, **_present(message=message, offsets=offsets))
            return
        if fr.auto_store:  # the primary runs without it (fastrecover stores one call late): refuse as plain does
            raise KafkaException(KafkaError(KafkaError._INVALID_ARG, _STORE_WITH_AUTO_STORE))
        fr.store_offsets(message, offsets)

    def committed(self, partitions: list[TopicPartition], timeout: float | None = None) -> list[TopicPartition]:
        """The KIP's merged committed(): everything below the answer is checkpointed in one log or the other.

        Returns:
            Per partition, the lowest durable offset of its open ranges if it has any, else
            Kafka's committed offset; fastrecover's mirror is hidden from ``metadata``.
        """
        fr = self._fr
        if fr is None:
            return _K.committed(self, partitions) if timeout is None else _K.committed(self, partitions, timeout)  # type: ignore[no-any-return]
        return fr.committed(partitions, timeout)

    # ---- assignment ------------------------------------------------------------------------

    def subscribe(self, topics: list[str], on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None) -> None:
        """Join the group; callbacks get this object, on_assign before recovery, on_revoke before hand-back."""
        fr = self._fr
        callbacks = {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}
        if fr is None or any(cb is not None and not callable(cb) for cb in callbacks.values()):
            _K.subscribe(self, topics, **_present(**callbacks))
            return
        fr.subscribe(topics, on_assign, on_revoke, on_lost)

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Assign as plain; with the mode on, each partition starting at its committed offset is recovered."""
        if self._fr is None or not _tp_list(partitions):
            _K.assign(self, partitions)
            return
        self._fr.assign(partitions, incremental=False)

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        """Add partitions as plain, recovering them as :meth:`assign` does."""
        if self._fr is None or not _tp_list(partitions):
            _K.incremental_assign(self, partitions)
            return
        self._fr.assign(partitions, incremental=True)

    def unassign(self) -> None:
        """Drop every partition; with the mode on, pending range progress is committed and ranges handed back."""
        if self._fr is None:
            _K.unassign(self)
            return
        self._fr.unassign(None)

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        """Drop ``partitions`` as :meth:`unassign` drops all."""
        if self._fr is None or not _tp_list(partitions):
            _K.incremental_unassign(self, partitions)
            return
        self._fr.incremental_unassign(partitions)

    # ---- flow control ----------------------------------------------------------------------

    def pause(self, partitions: list[TopicPartition]) -> None:
        """Pause fetching: with the mode on, the child's backfill of these partitions stops too."""
        if self._fr is None or not _tp_list(partitions):
            _K.pause(self, partitions)
            return
        self._fr.pause(partitions)

    def resume(self, partitions: list[TopicPartition]) -> None:
        """Resume fetching, the child's backfill of these partitions included."""
        if self._fr is None or not _tp_list(partitions):
            _K.resume(self, partitions)
            return
        self._fr.resume(partitions)

    def seek(self, partition: TopicPartition) -> None:
        """Seek; with the mode on, an offset inside a range being backfilled re-positions that range."""
        if self._fr is None or type(partition) is not TopicPartition:
            _K.seek(self, partition)
            return
        self._fr.seek(partition)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """New SASL credentials for the primary and the child (and every later child)."""
        if self._fr is None or not (isinstance(username, str) and isinstance(password, str)):
            _K.set_sasl_credentials(self, username, password)
            return
        self._fr.set_sasl_credentials(username, password)

    def close(self) -> None:
        """Commit per the commit settings, hand unfinished ranges back, close both consumers."""
        fr = self._fr
        if fr is None:
            _K.close(self)
            return
        try:
            fr.close()  # rebalance callbacks during close still see the mode-on methods
        finally:
            self._gate = None
            self._fr = None  # from here on every method is the closed primary's: RuntimeError('Consumer closed')

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The steady path of poll() in C when the extension is built (fastrecover/_accel.py); the Python
# method above is the reference and handles every other call.
Consumer.poll = fast_poll(_K.poll, Consumer.poll, IDLE_SLICE_S, FAST_CALLS)  # type: ignore[method-assign]


class _PlainMode(Consumer):
    """A ``fastrecover.Consumer`` with the mode off: every method is confluent_kafka's own."""

    poll = _K.poll  # type: ignore[assignment]
    consume = _K.consume
    commit = _K.commit  # type: ignore[assignment]
    store_offsets = _K.store_offsets
    committed = _K.committed  # type: ignore[assignment]
    subscribe = _K.subscribe
    assign = _K.assign
    incremental_assign = _K.incremental_assign
    unassign = _K.unassign
    incremental_unassign = _K.incremental_unassign
    pause = _K.pause
    resume = _K.resume
    seek = _K.seek
    set_sasl_credentials = _K.set_sasl_credentials
    close = _K.close


def _metrics_off() -> ConsumerMetrics:
    from fastrecover.metrics import ConsumerMetrics  # imported with the mode, not before (fastrecover/startup.py)

    return ConsumerMetrics(parallel_rebalance=False)


def _present(**kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if v is not None}


def _tp_list(partitions: object) -> bool:
    return isinstance(partitions, list) and all(type(tp) is TopicPartition for tp in partitions)


#: a mode-on ``Consumer`` until its mode is built (fastrecover/startup.py)
_PendingConsumer = pending_class(Consumer)


def __getattr__(name: str) -> Any:
    if name == "RecoveryReport":  # imported with the mode, not before (fastrecover/startup.py)
        from fastrecover.recoverer import RecoveryReport

        return RecoveryReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
