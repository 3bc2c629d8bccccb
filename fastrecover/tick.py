"""The tick: what a mode-on consumer does every 50 ms, at the start of a poll() or consume().

Deferred commits are routed, settled primary offsets stored, the child's events and finished
ranges taken in, a dead child restarted (at most once per back-off), stored range progress
promoted on the auto-commit cadence, the write-behind advanced, a recovery the store had to
finish carried out; then the steady gate learns whether the short path may run.
:class:`Ticker` owns the cadences and the child's restart count.
"""

from __future__ import annotations

import logging
import time

from fastrecover.commits import CommitRouter
from fastrecover.handover import Handover
from fastrecover.mode_state import ModeParts
from fastrecover.steady import TICK_S, SteadyGate, positions_period
from fastrecover.streams import Streams

log = logging.getLogger("fastrecover.consumer")


class Ticker:
    """The periodic work of the mode, run from the caller's thread."""

    def __init__(
        self, parts: ModeParts, router: CommitRouter, streams: Streams, handover: Handover, gate: SteadyGate
    ) -> None:
        self._parts = parts
        self._router = router
        self._streams = streams
        self._handover = handover
        self._gate = gate
        self.next_range_commit = time.monotonic() + parts.commit_interval_s
        self.next_child_restart = 0.0
        #: when the steady state reads the primary's positions again (see positions_period)
        self.next_positions = 0.0
        #: child handles replaced after a failure
        self.child_restarts = 0

    def tick_if_due(self, now: float) -> None:
        if self._gate.tick_due(now):
            self.tick(now)

    def tick(self, now: float) -> None:
        parts, router, streams, gate = self._parts, self._router, self._streams, self._gate
        gate.ticking(now)
        offsets, child, book = parts.offsets, parts.child, parts.book
        if offsets.untracked and now >= self.next_positions:
            parts.sync_positions()
            self.next_positions = now + positions_period(len(parts.partitions), parts.commit_interval_s)
        router.flush_deferred()
        router.store_primary()
        for event in child.drain_events():
            parts.apply_event(event)
        finished = child.drain_finished()
        if finished and parts.partitions.holds_eof:
            streams.release_eof(key for _token_id, key in finished)
        if child.failure is not None and book.has_work and now >= self.next_child_restart:
            # at most one new handle per back-off: a handle that cannot work must not spin
            self.next_child_restart = now + max(parts.settings.retry_backoff_s, TICK_S)
            self.child_restarts += 1
            log.warning(
                "child consumer died (%r); restarting it from the ranges' committed offsets and delivery cursors",
                child.failure,
            )
            child.restart()
        if parts.auto_commit and now >= self.next_range_commit:
            self.next_range_commit = now + parts.commit_interval_s
            book.promote_stored()
        parts.committer.tick(now)
        router.after_commits()
        if parts.link.open_ended:
            parts.link.get()  # what the background open raised (a store behind in schema) reaches the caller here
        parts.recoverer.hold_store_while_replaying(offsets.done, book.has_early and child.has_work)
        self._handover.finish_recoveries(wait=parts.recoverer.late_due(now, offsets.done))
        # a recovery the store has still to finish keeps the steady state: its replay runs at the plain
        # client's speed, and a tick comes at least every FAST_CALLS records or idle wait to finish it
        steady = not (streams.backfilling or router.pending or parts.partitions.holds_eof)
        if steady and parts.auto_store:
            offsets.untrack()  # a tick runs at a call's start: everything returned is done
        gate.set_steady(steady)
