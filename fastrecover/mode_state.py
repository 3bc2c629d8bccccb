"""The state a consumer in KIP-333 mode keeps, and what every path of it shares.

:class:`ModeState` owns the units (primary offsets, recoverer, child, book,
committer) and the small shared steps: the commit-metadata mirror of a
partition and what follows a store commit.  The paths build on it in layers,
one module each: :mod:`fastrecover.commits` (the two commit logs),
:mod:`fastrecover.handover` (assignment, revocation, handing ranges back) and
:mod:`fastrecover.parallel` (the merged record streams and the tick).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from confluent_kafka import Consumer as _KafkaConsumer
from confluent_kafka import KafkaException, Message, TopicPartition

from fastrecover._accel import StateBase
from fastrecover.batches import GapEvent, Run, SkipEvent
from fastrecover.book import RangeBook
from fastrecover.child import ChildReader
from fastrecover.committer import RangeCommitter, StoreLink
from fastrecover.config import Settings, child_config, is_cooperative, parse_bool
from fastrecover.primary import PrimaryOffsets
from fastrecover.recoverer import Recoverer
from fastrecover.tokens import TopicPartitionKey

log = logging.getLogger("fastrecover.consumer")

#: on_assign / on_revoke / on_lost, as confluent_kafka calls them
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

_K = _KafkaConsumer
#: librdkafka's spellings of auto.offset.reset that start a partition with no committed offset at its log start
_EARLIEST_RESETS = ("smallest", "earliest", "beginning")


def key_of(tp: TopicPartition) -> TopicPartitionKey:
    """The hashable key of a TopicPartition (which is mutable)."""
    return TopicPartitionKey(tp.topic, tp.partition)


#: the longest a poll() or consume() waits on the primary alone before the state is looked at again.
#: A recovery runs inside the call that serves the group's assignment, and librdkafka's wait does not
#: end when the child is given a backlog: a wait of the caller's whole timeout kept an idle topic's
#: backlog from the application until the timeout (for ever with no timeout), and confluent_kafka's own
#: 0.2-s slices (it wakes to check for signals) delayed it by up to 0.2 s.  A slice's records are
#: returned at once: records kept across slices could be committed by a revoke before the application
#: saw them.  An idle consumer wakes this often.
IDLE_SLICE_S = 0.05
#: poll() calls the steady state serves without reading the clock, while each returns a record: the
#: tick then runs at most this many records late (an idle poll() ends the run at once).  The C path
#: (fastrecover/_fastpoll.c) reads the clock itself at the end of a run and starts the next one when
#: no tick is due, so there a run ends only for a tick, a join, an empty poll or a change of state.
FAST_CALLS = 64
#: the slice while an assignment is expected (after subscribe() or a revoke, until the next assignment):
#: the backlog of a recovery then starts at most this long after it
JOIN_SLICE_S = 0.01
#: an expected assignment that has not come after this long (unsubscribe(), or a member left without
#: partitions) no longer shortens the slices
_JOIN_WAIT_S = 60.0


def _advise_static_membership(conf: dict[str, Any]) -> None:
    """Say once why a crash will cost a session timeout, and what to set instead.

    Fast recovery starts when the restarted process gets its partitions back. A dynamic member of
    a classic group gets them only once the dead member's session expires; a static one at once.
    """
    if conf.get("group.instance.id") or str(conf.get("group.protocol", "classic")).lower() != "classic":
        return
    log.warning(
        "group.instance.id is not set: after a crash, the restarted process gets its partitions back only "
        "when the dead member's session expires (session.timeout.ms=%s ms) and fresh records wait that long; "
        "give every member a stable group.instance.id (a host name, a StatefulSet ordinal) so that a restart "
        "takes its partitions back at once",
        conf.get("session.timeout.ms", 45000),
    )


class ModeState(StateBase):  # type: ignore[misc,valid-type]
    """The mode-on state of one consumer (``app`` is the application's object)."""

    def __init__(self, app: _KafkaConsumer, conf: dict[str, Any], settings: Settings) -> None:
        self.app = app
        self.settings = settings
        self.group = str(conf["group.id"])
        self.auto_commit = parse_bool("enable.auto.commit", conf.get("enable.auto.commit", True))
        self.auto_store = parse_bool("enable.auto.offset.store", conf.get("enable.auto.offset.store", True))
        self.eof = parse_bool("enable.partition.eof", conf.get("enable.partition.eof", False))
        self.commit_interval_s = int(conf.get("auto.commit.interval.ms", 5000)) / 1000.0
        self.cooperative = is_cooperative(conf)
        self.owner = settings.owner_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.book = RangeBook(self.group, settings.commit_mirror_key)
        self.link = StoreLink(
            settings.store_url,
            settings.store_create,
            settings.retry_backoff_s,
            settings.store_lock_timeout_ms,
            settings.store_statement_timeout_ms,
        )
        self.link.open_in_background()
        _advise_static_membership(conf)
        self.child = ChildReader(
            child_config(conf, settings), batch_size=settings.batch_size, broker_timeout_s=settings.recovery_timeout_s
        )
        self.committer = RangeCommitter(
            self.book,
            self.link,
            self.owner,
            interval_s=settings.commit_interval_s,
            on_commit=conf.get("on_commit"),
            on_fenced=self.child.drop_range,
        )
        self.recoverer = Recoverer(
            app,
            self.book,
            self.link,
            settings,
            self.group,
            self.owner,
            self.child.cluster_id,
            reset_earliest=str(conf.get("auto.offset.reset", "latest")).lower() in _EARLIEST_RESETS,
        )
        self.offsets = PrimaryOffsets()
        self.offsets.untracked = self.auto_store  # the steady state, from the start
        self.child_runs: list[Run] = []
        self.assigned: set[TopicPartitionKey] = set()
        self.routes: set[TopicPartitionKey] = set()
        self.floors: dict[TopicPartitionKey, int] = {}
        self.user_meta: dict[TopicPartitionKey, str] = {}
        self.held_eof: dict[TopicPartitionKey, Message] = {}
        self.ready_eof: list[Message] = []
        self.deferred: list[Message] = []
        self.deferred_stored: list[Message] = []
        self.user_cbs: tuple[RebalanceCallback | None, ...] = (None, None, None)
        self.in_rebalance = False
        self.assigned_in_cb = False
        self.next_tick = 0.0
        self.next_range_commit = time.monotonic() + self.commit_interval_s
        self.turn = False
        #: no backfill, deferred commit or held EOF: poll()/consume() take the short path
        self.steady = True
        #: poll() calls ``Consumer.poll`` may serve on its own before the next tick (steady state only)
        self.fast_calls = 0
        #: the timeout object those calls must pass (the one of the call that set fast_calls), and their wait
        self.fast_timeout: float | None = None
        self.fast_wait = IDLE_SLICE_S
        #: until when the waits on the primary use JOIN_SLICE_S (an assignment is expected)
        self.joining_until = 0.0
        self.next_child_restart = 0.0
        self.child_restarts = 0
        #: messages the primary returned (records and error events), for metrics()
        self.primary_messages = 0

    def expect_assignment(self) -> None:
        """subscribe() or a revoke: an assignment (and maybe a recovery) follows, inside some wait."""
        self.joining_until = time.monotonic() + _JOIN_WAIT_S

    def wait_slice(self, now: float) -> float:
        """How long the next wait on the primary may last before the state is looked at again."""
        return JOIN_SLICE_S if now < self.joining_until else IDLE_SLICE_S

    def sync_positions(self) -> bool:
        """Steady state: what the primary returned, from its positions instead of per record.

        Call it only when every record returned so far counts as done: at the start of
        a poll()/consume() (the application came back for more), in a commit() or a
        revoke (which settle the last record too).
        """
        if not self.offsets.untracked or not self.assigned:
            return True
        answer = self.positions(self.assigned)
        if answer is None:  # the records stay accounted for: the next sync reads them
            return False
        self.offsets.sync(answer)
        return True

    def positions(self, keys: Iterable[tuple[str, int]]) -> list[tuple[tuple[str, int], int]] | None:
        """The primary's fetch positions that librdkafka knows (negative: none yet); None when it cannot answer."""
        try:
            answer = _K.position(self.app, [TopicPartition(k[0], k[1]) for k in keys])
        except (KafkaException, ValueError) as exc:
            log.debug("primary positions unavailable: %s", exc)
            return None
        return [((tp.topic, tp.partition), tp.offset) for tp in answer if tp.error is None]

    def after_commits(self) -> None:
        """Ranges settled or finished in the store: refresh mirrors, move idle partitions' Kafka offsets."""
        if self.committer.settled_keys:
            keys, self.committer.settled_keys = self.committer.settled_keys, set()
            self.offsets.fold()
            self.offsets.dirty.update(k for k in keys if k in self.offsets.done)
        if self.committer.finished_keys:
            keys, self.committer.finished_keys = self.committer.finished_keys, set()
            self.routes = self.book.routes()
            self.advance_idle(keys)

    def advance_idle(self, keys: Iterable[TopicPartitionKey]) -> None:
        """committed() is never stale: a finished partition whose primary committed nothing moves to its floor."""
        tps = []
        self.offsets.fold()
        for key in keys:
            floor = self.floors.get(key)
            if floor is None or key not in self.assigned or self.book.held(key) or key in self.offsets.done:
                continue
            del self.floors[key]
            tps.append(TopicPartition(key.topic, key.partition, floor))
        if tps:
            try:
                _K.commit(self.app, offsets=tps, asynchronous=True)
            except KafkaException as exc:
                log.debug("moving finished partitions' offsets: %s", exc)

    def apply_event(self, event: SkipEvent | GapEvent) -> None:
        if isinstance(event, GapEvent):
            self.book.mark_done(event.token_id, range(event.start, event.end))
            return
        lost = self.book.skip_to(event.token_id, event.low)
        held = self.book.get(event.token_id)
        if held is not None and lost:
            log.warning(
                "retention deleted %d records of range #%d of %s before they were backfilled "
                "(skipped up to offset %d; recorded on the token)",
                lost,
                held.token.id,
                held.token.key,
                event.low,
            )

    def with_mirror(self, key: TopicPartitionKey, offset: int, user_metadata: str | None) -> TopicPartition:
        if user_metadata is not None:
            return TopicPartition(key.topic, key.partition, offset, metadata=user_metadata)
        # every held range counts, parked ones too: a commit without them would erase the only
        # record of ranges the store could not take
        text = self.book.metadata(key, offset) if self.settings.commit_mirror and self.book.holds(key) else ""
        if text:
            return TopicPartition(key.topic, key.partition, offset, metadata=text)
        return TopicPartition(key.topic, key.partition, offset)
