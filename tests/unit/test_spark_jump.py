"""The pure core of ``start_kafka_stream``: Spark checkpoint formats, the jump, the backfill chunks."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fastrecover.errors import CheckpointError, ConfigError
from fastrecover.spark.checkpoint import (
    OffsetLogEntry,
    is_kafka_offset,
    kafka_offsets,
    parse_journal,
    parse_offset_log,
    render_journal,
    render_kafka_offsets,
)
from fastrecover.spark.jump import (
    check_journal,
    check_new_jump,
    chunk_for,
    continues,
    jumped,
    lag_ranges,
    pending,
    take_chunk,
    task_count,
)
from fastrecover.spark.offsets import Piece
from fastrecover.spark.options import OWN_OPTIONS, options_to_check, parse_source_options
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
    [
        '{"t":{"0":-1}}',
        '{"t":{"x":1}}',
        '{"t":{"0":1.5}}',
        '{"t":{"0":true}}',
        '{"t":[1]}',
        "[1]",
        "{",
        # a partition named twice ("00" aliases "0"), or with digits int() takes but Spark never writes
        '{"t":{"0":1,"00":9}}',
        '{"t":{"\u00b2":1}}',
        '{"t":{"\u0663":1}}',
    ],
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
        {"version": True, "ranges": []},
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
    committed=st.dictionaries(st.sampled_from([K("t", i) for i in range(3)]), st.integers(0, 1000)),
    grow=st.lists(st.integers(0, 500), min_size=3, max_size=3),
    min_lag=st.integers(0, 300),
)
def test_a_jump_s_ranges_continue_the_batch_they_jump_from_and_no_other(
    committed: dict[K, int], grow: list[int], min_lag: int
) -> None:
    """An orphan jump entry that continues the last batch may be a running driver's (it is finished as
    journalled); one that does not was never written from this batch (it is deleted)."""
    ends = {key: offset + grow[key.partition] for key, offset in committed.items()}
    ranges = lag_ranges(committed, ends, min_lag)
    assert continues(committed, ranges)
    moved = jumped(committed, ranges)
    assert not ranges or not continues(moved, ranges)  # from the jump batch itself: not its own lag
    for r in ranges:
        assert not continues({**committed, r.key: r.start - 1}, ranges)
        assert not continues({k: v for k, v in committed.items() if k != r.key}, ranges)


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
        check_journal(jumps, chunks, "ck")  # what the chunks make of the journal is always consistent
        if batch == second_jump:
            check_new_jump(jumps, chunks, batch, ranges2, "ck")  # it starts past the first jump's ranges
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


# -- the journal as a whole ---------------------------------------------------------------------


def P(partition: int, start: int, end: int) -> Piece:
    return Piece("t", partition, start, end, True)


@pytest.mark.parametrize(
    ("jumps", "chunks", "files"),
    [
        # two jumps journal the same offsets (the review's stale_and_overlap.py): owed, and read, twice
        ({3: [P(0, 0, 100)], 8: [P(0, 50, 150)]}, {}, ["ck/fastrecover/jumps/3", "ck/fastrecover/jumps/8"]),
        ({3: [P(0, 0, 100), P(1, 0, 10)], 8: [P(1, 5, 6)]}, {}, ["jumps/3", "jumps/8"]),
        # two batches read the same offsets
        ({3: [P(0, 0, 100)]}, {5: [P(0, 0, 10)], 6: [P(0, 9, 20)]}, ["chunks/5", "chunks/6"]),
        # a chunk outside every jump range (untrusted.py: a chunk file from another checkpoint)
        ({3: [P(0, 0, 100)]}, {9: [P(0, 500, 600)]}, ["chunks/9", "jumps/3"]),
        ({3: [P(0, 0, 100)]}, {9: [P(1, 0, 10)]}, ["chunks/9"]),
        ({3: [P(0, 0, 100)]}, {9: [P(0, 90, 110)]}, ["chunks/9", "100-110"]),
        # a chunk of a batch before (or at) the jump whose ranges it holds
        ({7: [P(0, 0, 100)]}, {5: [P(0, 0, 10)]}, ["chunks/5", "before batch 5 (none)"]),
        ({7: [P(0, 0, 100)]}, {7: [P(0, 0, 10)]}, ["chunks/7"]),
        ({3: [P(0, 0, 10)], 7: [P(0, 10, 100)]}, {5: [P(0, 0, 20)]}, ["chunks/5", "10-20"]),
    ],
)
def test_journal_entries_that_contradict_each_other_are_refused_naming_the_files(
    jumps: dict[int, list[Piece]], chunks: dict[int, list[Piece]], files: list[str]
) -> None:
    with pytest.raises(CheckpointError) as error:
        check_journal(jumps, chunks, "ck/fastrecover")
    assert all(f in str(error.value) for f in files), str(error.value)


def test_a_consistent_journal_is_accepted() -> None:
    jumps = {3: [P(0, 0, 100), P(1, 0, 10)], 8: [P(0, 100, 150), P(1, 20, 30)]}
    chunks = {5: [P(0, 0, 50), P(1, 0, 10)], 6: [P(0, 50, 100)], 10: [P(0, 100, 120), P(1, 20, 30)]}
    check_journal(jumps, chunks, "ck")
    check_journal({}, {}, "ck")
    check_journal(jumps, {}, "ck")


entries_strategy = st.dictionaries(
    st.integers(0, 6),
    st.lists(
        st.tuples(st.integers(0, 1), st.integers(0, 30), st.integers(1, 10)), max_size=2, unique_by=lambda t: t[0]
    ),
    max_size=3,
)


@settings(max_examples=300, deadline=None)
@given(raw_jumps=entries_strategy, raw_chunks=entries_strategy)
def test_check_journal_refuses_exactly_what_an_offset_by_offset_account_finds_wrong(
    raw_jumps: dict[int, list[tuple[int, int, int]]], raw_chunks: dict[int, list[tuple[int, int, int]]]
) -> None:
    jumps = {b: [P(p, s, s + n) for p, s, n in rs] for b, rs in raw_jumps.items()}
    chunks = {b: [P(p, s, s + n) for p, s, n in rs] for b, rs in raw_chunks.items()}

    def offsets(entries: dict[int, list[Piece]]) -> Counter[tuple[int, int]]:
        return Counter((p.partition, o) for ps in entries.values() for p in ps for o in range(p.start, p.end))

    twice = any(n > 1 for n in offsets(jumps).values()) or any(n > 1 for n in offsets(chunks).values())
    outside = any(
        (c.partition, o) not in offsets({j: rs for j, rs in jumps.items() if j < b})
        for b, cs in chunks.items()
        for c in cs
        for o in range(c.start, c.end)
    )
    if twice or outside:
        with pytest.raises(CheckpointError):
            check_journal(jumps, chunks, "ck")
    else:
        check_journal(jumps, chunks, "ck")


def test_a_new_jump_over_journalled_ranges_is_refused_as_kafka_s_offsets_going_back() -> None:
    jumps = {3: [P(0, 100, 200)], 6: [P(1, 0, 50)]}
    chunks = {5: [P(0, 100, 130)]}
    # offsets 120-200 overlap: 120-130 were read by chunk 5, 130-200 are still owed
    with pytest.raises(CheckpointError, match=r"jumps/3 .*batch 9.*120-200 \(70 of those offsets still owed, 10 "):
        check_new_jump(jumps, chunks, 9, [P(0, 120, 400)], "ck/fastrecover")
    with pytest.raises(CheckpointError, match="deleted and re-created, or its log truncated"):
        check_new_jump(jumps, chunks, 9, [P(1, 49, 60)], "ck/fastrecover")
    # past every journalled range, or another partition: a new lag, journalled as usual
    check_new_jump(jumps, chunks, 9, [P(0, 200, 400), P(1, 50, 60), P(2, 0, 10)], "ck/fastrecover")


# -- options ------------------------------------------------------------------------------------

#: every option of Spark 4's Kafka source (KafkaSourceProvider of spark-sql-kafka-0-10 4.2.0), with a
#: value Spark's streaming source takes; the batch-only ones (ending*) are Spark's to refuse or ignore
SPARK_OPTIONS = {
    "startingOffsets": '{"t":{"0":-2,"1":5},"u":{"0":-1}}',
    "startingTimestamp": "1700000000000",
    "startingOffsetsByTimestamp": '{"t":{"0":1700000000000}}',
    "startingOffsetsByTimestampStrategy": "latest",
    "endingOffsets": "latest",
    "endingTimestamp": "1700000000000",
    "endingOffsetsByTimestamp": '{"t":{"0":1700000000000}}',
    "failOnDataLoss": "false",
    "kafkaConsumer.pollTimeoutMs": "1000",
    "fetchOffset.numRetries": "5",
    "fetchOffset.retryIntervalMs": "20",
    "maxOffsetsPerTrigger": "1000",
    "minOffsetsPerTrigger": "10",
    "maxTriggerDelay": "5m",
    "minPartitions": "4",
    "maxRecordsPerPartition": "100",
    "groupIdPrefix": "orders-app",
    "includeHeaders": "true",
    "kafka.group.id": "orders-app",
    "kafka.isolation.level": "read_committed",
}


@pytest.mark.parametrize("what", [{"subscribe": "t"}, {"assign": '{"t":[0,1]}'}, {"subscribePattern": r"t\p{Alpha}*+"}])
def test_every_option_of_spark_s_kafka_source_is_spark_s_and_not_refused(what: dict[str, str]) -> None:
    """start_kafka_stream passes every option but its own to Spark's source, which checks them itself."""
    options = {"kafka.bootstrap.servers": "h:1", **what, **SPARK_OPTIONS}
    assert not [k for k in options if k.lower().startswith(OWN_OPTIONS)]
    opts = parse_source_options(options_to_check(options), query_required=False)
    # the Spark options the recovery uses too, with Spark's meaning
    assert (opts.fail_on_data_loss, opts.include_headers, opts.min_partitions) == (False, True, 4)
    assert opts.kafka == {"bootstrap.servers": "h:1", "isolation.level": "read_committed"}


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ({"backfillTasks": "0"}, "backfillTasks"),
        ({"maxBackfillOffsetsPerTrigger": "x"}, "maxBackfillOffsetsPerTrigger"),
        ({"fastrecover.backfill.min.offsets": "-1"}, "fastrecover.backfill.min.offsets"),
        ({"includeHeaders": "yes"}, "includeHeaders"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({"minPartitions": "0"}, "minPartitions"),
        ({"kafka.sasl.login.callback.handler.class": "x.Y"}, "kafka.sasl.login.callback.handler.class"),
        ({"kafka.bootstrap.servers": ""}, "kafka.bootstrap.servers"),
        ({"subscribe": ""}, "subscribe"),
        ({"subscribePattern": " "}, "subscribePattern"),
        ({"assign": '{"t":[0]}'}, "exactly one"),
    ],
)
def test_our_options_and_those_the_recovery_shares_are_still_checked(bad: dict[str, str], named: str) -> None:
    options = {"kafka.bootstrap.servers": "h:1", "subscribe": "t", **bad}
    if "subscribePattern" in bad:
        options.pop("subscribe")
    with pytest.raises(ConfigError, match=named):
        parse_source_options(options_to_check(options), query_required=False)


def test_a_journalled_jump_past_the_log_end_is_not_written() -> None:
    """A jump another (or a dead) driver journalled is written as journalled only while Kafka's log still
    reaches its end: past it, the topic was re-created or truncated since, and the batch would skip records."""
    from fastrecover.spark.jump import check_continued_jump
    from fastrecover.tokens import TopicPartitionKey

    lag = [Piece("t", 0, 10, 50, True), Piece("t", 1, 5, 9, True)]
    ends = {TopicPartitionKey("t", 0): 50, TopicPartitionKey("t", 1): 12}
    check_continued_jump(3, lag, ends, "ck/fastrecover")  # the log grew since, or did not move: written
    with pytest.raises(CheckpointError, match=r"t\[0\].*\(40\).*re-created"):
        check_continued_jump(3, lag, {**ends, TopicPartitionKey("t", 0): 40}, "ck/fastrecover")
    with pytest.raises(CheckpointError, match=r"t\[1\].*\(unknown\)"):
        check_continued_jump(3, lag, {TopicPartitionKey("t", 0): 50}, "ck/fastrecover")
