"""The range token: one backfill range as the child's commit log records it.

A pure value type shared by the store (which persists it), the recovery decision
(which creates and merges them) and the consumer (which tracks their progress).
``owner`` and ``epoch`` fence a range: a holder may only write a token while its
(owner, epoch) pair is still the one in the store.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.values import replace, value


class TokenState(str, Enum):
    OPEN = "open"
    DONE = "done"
    #: retired by a recovery that found the range's facts outdated (an offset reset, a re-created
    #: topic, a restored store): kept for audit, never read, never used to skip an offset
    SUPERSEDED = "superseded"


class TopicPartitionKey(NamedTuple):
    """Hashable (topic, partition) key; confluent_kafka.TopicPartition is mutable.

    A named tuple, so it hashes and compares in C and equals the plain
    ``(msg.topic(), msg.partition())`` tuples the hot paths build from messages.
    """

    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}]"


@value
class Token:
    """A persisted backfill range of one partition of one consumer group."""

    id: int
    group: str
    topic: str
    partition: int
    progress: RangeProgress
    skipped: int = 0
    owner: str | None = None
    epoch: int = 0
    state: TokenState = TokenState.OPEN
    #: ``<cluster id>/<nonce>``: the recovery (or hand-back) that last wrote or kept this range (see
    #: :mod:`fastrecover.recovery`); None for ranges written before lineages existed
    lineage: str | None = None

    @property
    def key(self) -> TopicPartitionKey:
        return TopicPartitionKey(self.topic, self.partition)

    @property
    def span(self) -> OffsetRange:
        return self.progress.span

    @property
    def is_open(self) -> bool:
        return self.state is TokenState.OPEN

    @property
    def is_superseded(self) -> bool:
        return self.state is TokenState.SUPERSEDED

    def with_progress(self, progress: RangeProgress, skipped: int | None = None) -> Token:
        return replace(
            self,
            progress=progress,
            skipped=self.skipped if skipped is None else skipped,
            state=TokenState.DONE if progress.done else TokenState.OPEN,
        )

    def describe(self) -> str:
        p = self.progress
        return (
            f"range #{self.id} {self.group}/{self.topic}[{self.partition}] [{p.start}, {p.end}) "
            f"committed={p.committed} owner={self.owner} epoch={self.epoch} {self.state.value}"
        )
