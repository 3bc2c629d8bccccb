"""The steady gate: when ``Consumer.poll()`` may serve the primary's records alone, and its counters.

With no backfill, deferred commit or held EOF the mode adds nothing to a record: poll() then
forwards to confluent_kafka's, for a *run* of up to ``FAST_CALLS`` calls that read no clock.
:class:`SteadyGate` holds what such a run needs (its length, the timeout object it was started with
and its wait, the next tick and the end of a join) as the C fields of
:class:`fastrecover._fastpoll.FastState` when the extension is built; :func:`poll` is the Python
reference of ``Consumer.poll`` that reads and writes them, and ``fastrecover/_fastpoll.c`` repeats
it branch for branch.  The consumer keeps the gate at ``_gate`` and the mode at ``_fr``: both are
read here and in the C path, and written by the consumer alone.  Every other unit changes the gate
through its methods (a tick, a backfill starting, an assignment expected or made).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from confluent_kafka import Message
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover._accel import StateBase
from fastrecover.startup import built_mode

if TYPE_CHECKING:
    from fastrecover.consumer import Consumer

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
#: the slice of a steady consumer that has returned nothing for IDLE_LONG_AFTER_S: confluent_kafka's own
#: poll() wakes this often (to look for signals), so a long-idle consumer wakes as often as a plain one, and
#: a batch consume() of the first records after the silence returns when plain's would.  At IDLE_SLICE_S
#: an idle consumer's caller spent 11 (poll) to 40 (consume) times plain's CPU waking up, 3 to 4 times
#: what it spends now (fastrecover_tools.bench.idle).  The price: a recovery that comes inside such a
#: slice with no revoke before it (a cooperative or KIP-848 assignment to a consumer with nothing to
#: read) hands its backlog to the application up to this long after it.
IDLE_LONG_SLICE_S = 0.2
#: how long a steady consumer returns nothing before its slices grow to IDLE_LONG_SLICE_S
IDLE_LONG_AFTER_S = 1.0

_K = _KafkaConsumer
_SLICE = IDLE_SLICE_S
_NUMBER = (int, float)
#: the tick's period: range commits written behind, the child's events, stored offsets
TICK_S = 0.05
#: partitions whose positions a tick may read: an assignment larger than this has them read every few ticks
POSITIONS_PER_TICK = 256
#: the longest the steady state leaves the primary's positions unread (while calls keep coming)
_POSITIONS_MAX_S = 1.0
#: an expected assignment that has not come after this long (unsubscribe(), or a member left without
#: partitions) no longer shortens the slices
_JOIN_WAIT_S = 60.0
#: after an assignment the slices stay short until the primary returns its first record, or this long.
#: A recovery that jumped to the log end gets fresh records one at a time, at the producers' rate, and
#: a batch consume() waits for its whole batch or the end of its slice: with IDLE_SLICE_S the first fresh
#: records of a jump waited 50 ms behind a batch they could not fill
_FIRST_RECORD_WAIT_S = 1.0


def positions_period(partitions: int, auto_commit_interval_s: float) -> float:
    """How often a tick reads the primary's positions in the steady state (``ModeParts.sync_positions``).

    A read costs a ``TopicPartition`` per assigned partition, whatever moved: at 2,048 partitions,
    read at every tick, it took about a sixth of the caller's thread from the records of a replay.
    The positions only become the offsets that librdkafka's auto-commit sends (an offset-less
    commit(), a revoke and a backfill's start read them themselves), so a large assignment has them
    read every few ticks: ``POSITIONS_PER_TICK`` partitions' worth per tick on average, and always
    several times per auto-commit interval.  A later read only makes an auto-commit carry older
    offsets: more duplicates after a crash, never a skipped record.
    """
    ticks = max(1, -(-partitions // POSITIONS_PER_TICK))
    return max(TICK_S, min(TICK_S * ticks, _POSITIONS_MAX_S, auto_commit_interval_s / 4))


class SteadyGate(StateBase):  # type: ignore[misc,valid-type]
    """Whether the steady path may run, the run's counters, and when the next tick is due."""

    def __init__(self) -> None:
        #: poll() calls ``Consumer.poll`` may serve on its own before the next tick (steady state only)
        self.fast_calls = 0
        #: the timeout object those calls must pass (the one of the call that set fast_calls), and their wait
        self.fast_timeout: float | None = None
        self.fast_wait = IDLE_SLICE_S
        #: messages the primary returned (records and error events), for metrics()
        self.primary_messages = 0
        self.next_tick = 0.0
        #: until when the waits on the primary use JOIN_SLICE_S (an assignment is expected, or was just
        #: made and no record has come since)
        self.joining_until = 0.0
        #: an assignment was made and the primary has returned no record since
        self.awaiting_first = False
        #: no backfill, deferred commit or held EOF: poll()/consume() take the short path
        self.steady = True
        #: since when nothing came (no message, no change of state), and the message count it saw last
        self.idle_since = time.monotonic()
        self.seen_messages = 0

    # ---- the tick ------------------------------------------------------------------------------

    def tick_due(self, now: float) -> bool:
        return now >= self.next_tick

    def ticking(self, now: float) -> None:
        """A tick starts at ``now``: the next one is due a period later."""
        self.next_tick = now + TICK_S

    def set_steady(self, steady: bool) -> None:
        """What a tick found: no backfill, deferred commit or held EOF (``steady``), or some."""
        self.steady = steady
        if not steady:
            self.fast_calls = 0
            self.idle_since = time.monotonic()

    def leave(self) -> None:
        """A backfill starts: the next call takes the full path."""
        self.set_steady(False)

    # ---- joins ---------------------------------------------------------------------------------

    def expect_assignment(self) -> None:
        """subscribe() or a revoke: an assignment (and maybe a recovery) follows, inside some wait."""
        self.joining_until = self.idle_since = time.monotonic() + _JOIN_WAIT_S
        self.awaiting_first = False  # the records of partitions still held must not end this wait's slices

    def assignment_made(self) -> None:
        self.joining_until = self.idle_since = time.monotonic() + _FIRST_RECORD_WAIT_S
        self.awaiting_first = True

    def wait_slice(self, now: float) -> float:
        """How long the next wait on the primary may last before the state is looked at again.

        Messages the C path returned count too: it adds to ``primary_messages``, which this compares.
        """
        if now < self.joining_until:
            return JOIN_SLICE_S
        if self.primary_messages != self.seen_messages:
            self.seen_messages = self.primary_messages
            self.idle_since = now
        if self.steady and now - self.idle_since >= IDLE_LONG_AFTER_S:
            return IDLE_LONG_SLICE_S
        return IDLE_SLICE_S

    # ---- runs ----------------------------------------------------------------------------------

    def start_run(self, timeout: float | None) -> None:
        """The clock was read: the next calls with this timeout skip it (Consumer.poll), each waiting
        for the timeout or, if longer, one slice."""
        self.fast_calls = FAST_CALLS
        self.fast_timeout = timeout
        self.fast_wait = timeout if timeout is not None and 0 <= timeout <= IDLE_SLICE_S else IDLE_SLICE_S

    def end_run(self) -> None:
        """Nothing came: the next call reads the clock (the tick)."""
        self.fast_calls = 0

    def count(self, messages: int) -> None:
        self.primary_messages += messages
        if messages and self.awaiting_first:
            self.awaiting_first = False
            self.joining_until = 0.0  # the first records came: the idle slices again


def poll(self: Consumer, timeout: float | None = None) -> Message | None:
    """One record or event; with the mode on, live records and backfilled ones interleaved.

    Args:
        timeout: seconds to wait; None waits forever, as plain.
    Returns:
        A ``Message`` (a record, or an event whose ``error()`` is set) or None on timeout.
        Order holds within the live stream and within each range, not across the two.
    Raises:
        KafkaException, and what the application's callbacks raise, as plain.
    """
    gate = self._gate
    if gate is not None and gate.fast_calls:
        # The steady state (no range; records untracked, see ParallelMode.poll), inlined: poll() runs
        # once per record, and a second frame plus a clock read cost more than half a µs here.  A
        # call passing the very timeout object of the call that started the run (a loop's constant)
        # waits what that call worked out: the timeout, or one slice of a longer wait; another float
        # longer than a slice waits one slice.  The rest of a longer wait is ParallelMode.poll's, in
        # slices (a recovery in the wait gives the child a backlog librdkafka's wait does not see).
        if timeout is gate.fast_timeout:
            wait: float | None = gate.fast_wait
        elif type(timeout) is float and timeout > _SLICE:
            wait = _SLICE
        else:
            wait = None  # the full path below (a short wait worked out anew, or a wrong type)
        if wait is not None:
            gate.fast_calls -= 1
            msg = _K.poll(self, wait)
            if msg is None:
                gate.fast_calls = 0  # nothing came: the next call reads the clock (the tick)
                if wait is not timeout:
                    rest = timeout if timeout is None or timeout < 0 else max(0.0, timeout - _SLICE)
                    return self._fr.poll(rest)  # type: ignore[union-attr]
            else:
                gate.primary_messages += 1
            return msg  # type: ignore[no-any-return]
    fr = self._fr or built_mode(self)
    if fr is None and timeout is None:  # a subclass with the mode off: confluent_kafka's poll() waits forever
        return _K.poll(self)  # type: ignore[no-any-return]
    if fr is None or (timeout is not None and type(timeout) not in _NUMBER):
        return _K.poll(self, timeout) if fr is None else fr.note_primary(_K.poll(self, timeout))  # type: ignore[arg-type]
    return fr.poll(timeout)
