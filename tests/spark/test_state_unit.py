"""Pure parts of the Spark integration that need neither Spark nor a broker: options, store mirror, claims."""

from __future__ import annotations

import pytest

from fastrecover.errors import ConfigError
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.spark.offsets import PartitionState, Piece, SourceOffset
from fastrecover.spark.options import parse_ranges_options, parse_source_options
from fastrecover.spark.ranges import claim_pieces
from fastrecover.spark.state import ACTIVE, Claim, ClaimedRange, done_by, mirror_plan
from fastrecover.tokens import Token, TokenState
from fastrecover.tokens import TopicPartitionKey as K

BASE = {"kafka.bootstrap.servers": "h:1", "subscribe": "b, a,a", "fastrecover.query": "q"}


def token(tid: int, start: int, end: int, committed: int | None = None) -> Token:
    progress = RangeProgress(start, end, start if committed is None else committed)
    return Token(tid, "spark-query:q", "a", 0, progress, owner="spark-query:q", epoch=1)


def test_source_options_defaults_and_errors() -> None:
    opts = parse_source_options({k.lower(): v for k, v in BASE.items()})
    assert opts.topics == ("a", "b") and opts.kafka == {"bootstrap.servers": "h:1"}
    assert (opts.starting, opts.min_lag, opts.max_backfill, opts.backfill_tasks) == (
        "latest",
        100,
        100_000,
        4,
    )
    assert opts.fail_on_data_loss and opts.fresh_wait_s == 1.0
    tuned = parse_source_options(
        {
            **BASE,
            "maxbackfilloffsetspertrigger": "5",
            "failondataloss": "false",
            "startingoffsets": "EARLIEST",
            "freshwaitms": "0",
        }
    )
    assert (tuned.max_backfill, tuned.fail_on_data_loss, tuned.starting, tuned.fresh_wait_s) == (
        5,
        False,
        "earliest",
        0.0,
    )
    for bad in (
        {"subscribe": ""},
        {"fastrecover.query": ""},
        {"kafka.bootstrap.servers": ""},
        {"backfilltasks": "0"},
        {"failondataloss": "maybe"},
        {"startingoffsets": "middle"},
        {"kafka.group.id": "g"},
        {"fastrecover.store.url": "nope"},
    ):
        with pytest.raises(ConfigError):
            parse_source_options({**BASE, **bad})


def test_ranges_options() -> None:
    opts = parse_ranges_options({"kafka.bootstrap.servers": "h:1", "group": "g"})
    assert (opts.group, opts.job, opts.owner) == ("g", "default", "spark-ranges:default")
    with pytest.raises(ConfigError):
        parse_ranges_options({"kafka.bootstrap.servers": "h:1"})
    with pytest.raises(ConfigError, match="streaming query"):
        parse_ranges_options({"kafka.bootstrap.servers": "h:1", "group": "spark-query:q"})


def test_mirror_plan_follows_pending_ranges_as_they_shrink() -> None:
    a0 = K("a", 0)
    # A new pending range gets a token.
    end = SourceOffset({a0: PartitionState(0, 1000, (OffsetRange(100, 900),))})
    assert mirror_plan([], end) == ([(a0, 100, 900)], [])
    # Backfill ate its front: the token's committed offset follows.
    t = token(1, 100, 900)
    end = SourceOffset({a0: PartitionState(0, 1000, (OffsetRange(400, 900),))})
    ((tok, progress),) = mirror_plan([t], end)[1]
    assert tok.id == 1 and progress.committed == 400 and not progress.done
    # Gone from the offset: done.
    creates, updates = mirror_plan([token(1, 100, 900, 400)], SourceOffset({a0: PartitionState(0, 1000)}))
    assert creates == [] and updates[0][1].done
    # A second downtime adds a second range next to the first, which stays matched by its end.
    end = SourceOffset({a0: PartitionState(0, 2000, (OffsetRange(400, 900), OffsetRange(1000, 2000)))})
    creates, updates = mirror_plan([token(1, 100, 900, 400)], end)
    assert creates == [(a0, 1000, 2000)] and updates == []


def test_claim_pieces_skip_what_is_already_done() -> None:
    claimed = [
        ClaimedRange(1, 2, "a", 0, 100, 200, 150, (160, 161, 170)),
        ClaimedRange(2, 1, "a", 1, 0, 10, 10),
    ]
    assert claim_pieces(claimed) == [
        Piece("a", 0, 150, 160, True),
        Piece("a", 0, 162, 170, True),
        Piece("a", 0, 171, 200, True),
    ]
    assert ClaimedRange.from_json(claimed[0].to_json()) == claimed[0]


def test_backfill_budget_follows_the_engines_read_limit() -> None:
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows, ReadMinRows

    from fastrecover.spark.source import backfill_budget

    assert backfill_budget(ReadAllAvailable(), 100) is None
    assert backfill_budget(ReadMaxRows(7), 100) == 7
    assert backfill_budget(ReadMinRows(7), 100) == 100


def test_done_by_a_claim_means_done_at_its_owner_and_claimed_epoch() -> None:
    """complete_ranges' own writes, told apart from a consumer's (which took the range back first)."""
    owner = "spark-ranges:job"
    ranges = (ClaimedRange(1, 2, "t", 0, 0, 10, 0), ClaimedRange(2, 2, "t", 1, 0, 10, 0))
    claim = Claim("g", "job", 1, owner, ACTIVE, ranges)

    def held(tid: int, holder: str, epoch: int, done: bool) -> Token:
        progress = RangeProgress(0, 10, 10 if done else 0)
        state = TokenState.DONE if done else TokenState.OPEN
        return Token(tid, "g", "t", tid - 1, progress, owner=holder, epoch=epoch, state=state)

    assert done_by(claim, [held(1, owner, 2, True), held(2, owner, 2, False)]) == [held(1, owner, 2, True)]
    assert done_by(claim, [held(1, "consumer", 3, True), held(2, owner, 2, False)]) == []  # taken back, done
    assert done_by(claim, [held(1, owner, 3, True)]) == []  # a later claim's epoch
    assert done_by(claim, [held(3, owner, 2, True)]) == []  # not a range of this claim
