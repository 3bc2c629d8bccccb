"""The pure core of ``start_kafka_stream``: Spark checkpoint formats, the jump, the backfill chunks."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.errors import CheckpointError
from fastrecover.spark.checkpoint import (
    OffsetLogEntry,
    is_kafka_offset,
    kafka_offsets,
    parse_journal,
    parse_offset_log,
    render_journal,
    render_kafka_offsets,
)
from fastrecover.spark.jump import chunk_for, jumped, lag_ranges, pending, take_chunk, task_count
from fastrecover.spark.offsets import Piece
from fastrecover.spark.planning import fair_shares
from fastrecover.tokens import TopicPartitionKey as K

SPARK_ENTRY = (
    'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1795457343927,"conf":{"spark.sql.shuffle.partitions":"2"}}\n'
    '{"orders":{"0":50,"1":75}}\n7'
)


# -- Spark's offset log -----------------------------------------------------------------------


def test_an_offset_log_entry_as_spark_writes_it_round_trips_and_its_kafka_line_is_found() -> None:
    entry = parse_offset_log(SPARK_ENTRY, "offsets/4")
    assert entry.metadata["batchTimestampMs"] == 1795457343927
    assert [is_kafka_offset(s) for s in entry.sources] == [True, False]  # Kafka, then the ticker's number
    assert kafka_offsets(entry.sources[0], "offsets/4") == {K("orders", 0): 50, K("orders", 1): 75}
    assert parse_offset_log(entry.render(), "x") == entry
    moved = entry.with_source(0, render_kafka_offsets({K("orders", 0): 90, K("orders", 1): 75}), 5)
    assert moved.sources == ('{"orders":{"0":90,"1":75}}', "7")
    assert moved.metadata == {**entry.metadata, "batchTimestampMs": 5}


@pytest.mark.parametrize(
    "text",
    ["", "v2\n{}\n{}", "v1\n{}", "v1\nnot json\n{}", "v1\n[1]\n{}"],
)
def test_a_malformed_offset_log_entry_is_refused_naming_the_file(text: str) -> None:
    with pytest.raises(CheckpointError, match="offsets/9"):
        parse_offset_log(text, "offsets/9")


@pytest.mark.parametrize(
    "line",
    ['{"t":{"0":-1}}', '{"t":{"x":1}}', '{"t":{"0":1.5}}', '{"t":{"0":true}}', '{"t":[1]}', "[1]", "{"],
)
def test_a_kafka_offset_that_is_not_partition_to_offset_is_refused(line: str) -> None:
    with pytest.raises(CheckpointError, match="offsets/3"):
        kafka_offsets(line, "offsets/3")


def test_only_the_kafka_shape_is_taken_for_kafka() -> None:
    assert not is_kafka_offset("-")
    assert not is_kafka_offset("12")
    assert is_kafka_offset('{"t":{"0":3}}')
    assert not is_kafka_offset("{")


# -- our journal ------------------------------------------------------------------------------

pieces_strategy = st.lists(
    st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 2), st.integers(0, 10**6), st.integers(1, 10**4)),
    max_size=6,
)


@given(pieces_strategy)
def test_a_journal_entry_round_trips(raw: list[tuple[str, int, int, int]]) -> None:
    seen: set[tuple[str, int]] = set()
    pieces = []
    for topic, part, start, n in raw:
        if (topic, part) not in seen:  # one range per partition: disjoint by construction
            seen.add((topic, part))
            pieces.append(Piece(topic, part, start, start + n, True))
    got = parse_journal(render_journal(pieces), "j")
    assert got == sorted(pieces, key=lambda p: (p.topic, p.partition, p.start))


@pytest.mark.parametrize(
    "doc",
    [
        "nope",
        {"version": 2, "ranges": []},
        {"version": 1, "ranges": {}},
        {"version": 1, "ranges": [["t", 0, 5, 5]]},
        {"version": 1, "ranges": [["t", 0, 6, 5]]},
        {"version": 1, "ranges": [["t", -1, 0, 5]]},
        {"version": 1, "ranges": [["", 0, 0, 5]]},
        {"version": 1, "ranges": [["t", 0, 0, "5"]]},
        {"version": 1, "ranges": [["t", 0, 0]]},
        {"version": 1, "ranges": [["t", 0, 0, 5], ["t", 0, 4, 9]]},
    ],
)
def test_a_malformed_journal_entry_is_refused_naming_the_file(doc: object) -> None:
    with pytest.raises(CheckpointError, match="fastrecover/chunks/7"):
        parse_journal(json.dumps(doc) if not isinstance(doc, str) else doc, "fastrecover/chunks/7")


# -- the jump ---------------------------------------------------------------------------------


def test_the_jump_covers_partitions_lagging_by_at_least_min_lag_and_moves_only_them() -> None:
    committed = {K("t", 0): 10, K("t", 1): 10, K("t", 2): 10, K("u", 0): 7}
    ends = {K("t", 0): 110, K("t", 1): 109, K("t", 2): 5, K("u", 0): 500}  # t-2: log end below (re-created)
    ranges = lag_ranges(committed, ends, 100)
    assert ranges == [Piece("t", 0, 10, 110, True), Piece("u", 0, 7, 500, True)]
    assert jumped(committed, ranges) == {K("t", 0): 110, K("t", 1): 10, K("t", 2): 10, K("u", 0): 500}
    assert lag_ranges(committed, {}, 1) == []


@given(
    owed=st.dictionaries(st.sampled_from([K("a", i) for i in range(4)]), st.integers(0, 1000)),
    budget=st.one_of(st.none(), st.integers(0, 3000)),
)
def test_fair_shares_hand_out_the_budget_and_never_more_than_owed(owed: dict[K, int], budget: int | None) -> None:
    grant = fair_shares(owed, budget)
    assert set(grant) == set(owed)
    assert all(0 <= grant[k] <= owed[k] for k in owed)
    total = sum(owed.values())
    assert sum(grant.values()) == (total if budget is None else min(budget, total))


ranges_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 500), st.integers(1, 400)),
    min_size=1,
    max_size=3,
    unique_by=lambda t: t[0],
)


@settings(max_examples=200, deadline=None)
@given(
    first=ranges_strategy,
    second=ranges_strategy,
    budget=st.integers(25, 500),
    jump_at=st.integers(1, 5),
    gap=st.integers(2, 6),
)
def test_the_chunks_of_successive_batches_read_every_journalled_offset_once(
    first: list[tuple[int, int, int]], second: list[tuple[int, int, int]], budget: int, jump_at: int, gap: int
) -> None:
    """Two jumps (a second restart before the first backlog drained); batches run, and some run twice."""
    ranges1 = [Piece("t", p, s, s + n, True) for p, s, n in first]
    # the second jump's ranges start where the first jump's ends (Spark's offsets moved past them)
    top = {p.partition: p.end for p in ranges1}
    ranges2 = [Piece("t", p, top.get(p, 0) + s, top.get(p, 0) + s + n, True) for p, s, n in second]
    jumps = {jump_at: ranges1}
    chunks: dict[int, list[Piece]] = {}
    second_jump = jump_at + gap
    batch = jump_at + 1
    while batch < 10_000:
        if batch == second_jump:
            jumps[batch] = ranges2
            batch += 1
            continue
        chunk = chunk_for(batch, jumps, chunks, budget)
        assert sum(map(len, chunk)) <= budget
        if batch - 1 in jumps:
            assert chunk == []  # the first batch after a jump reads fresh records only
        if chunk:
            chunks[batch] = chunk
        # a replay of this batch, or of an earlier one, reads what its first attempt read
        assert chunk_for(batch, jumps, chunks, budget) == chunk
        earlier = min(chunks, default=batch)
        assert chunk_for(earlier, jumps, chunks, budget) == chunks.get(earlier, chunk)
        owed = pending([r for rs in jumps.values() for r in rs], [c for cs in chunks.values() for c in cs])
        if batch > second_jump and not owed:
            break
        batch += 1
    read = sorted((c.partition, o) for cs in chunks.values() for c in cs for o in range(c.start, c.end))
    journalled = sorted((r.partition, o) for rs in jumps.values() for r in rs for o in range(r.start, r.end))
    assert read == journalled


def test_a_chunk_takes_each_partition_oldest_first() -> None:
    owed = [Piece("t", 0, 300, 400, True), Piece("t", 0, 0, 100, True), Piece("t", 1, 50, 60, True)]
    expected = [Piece("t", 0, 0, 100, True), Piece("t", 0, 300, 310, True), Piece("t", 1, 50, 60, True)]
    assert take_chunk(owed, 120) == expected
    assert take_chunk(owed, None) == sorted(owed, key=lambda p: (p.partition, p.start))
    assert take_chunk([], 10) == []


def test_an_offset_log_entry_renders_as_spark_reads_it() -> None:
    entry = OffsetLogEntry({"batchWatermarkMs": 0}, ('{"t":{"0":1}}',))
    assert entry.render() == 'v1\n{"batchWatermarkMs":0}\n{"t":{"0":1}}'


def test_a_small_chunk_is_not_cut_into_tasks_below_the_minimum_size() -> None:
    def chunk(*sizes: int) -> list[Piece]:
        return [Piece("t", p, 0, n, True) for p, n in enumerate(sizes)]

    assert task_count(chunk(10_000, 10_000), 4) == 2  # one task per range at least
    assert task_count(chunk(1_000_000, 1_000_000), 4) == 4
    assert task_count(chunk(150_000, 100_000), 8) == 3
    assert task_count(chunk(50), 1) == 1
