"""plan_rollback (pure): where Kafka's offset goes when a group returns to plain consumers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fastrecover.book import mirror_context
from fastrecover.codec import encode_mirror, mark, new_lineage
from fastrecover.ranges import OffsetRange, RangeProgress
from fastrecover.rollback import format_rollback, mirror_only_spans, plan_rollback
from fastrecover.tokens import Token, TokenState, TopicPartitionKey


def _token(token_id: int, partition: int, start: int, end: int, committed: int, *, done: bool = False) -> Token:
    progress = RangeProgress(start, end, end if done else committed)
    return Token(token_id, "g", "t", partition, progress, state=TokenState.DONE if done else TokenState.OPEN)


def test_moves_back_to_the_lowest_open_committed_offset() -> None:
    tokens = [_token(1, 0, 10, 300, 110), _token(2, 0, 400, 500, 420), _token(3, 1, 0, 50, 20)]
    plans = plan_rollback(tokens, {("t", 0): 600, ("t", 1): 10})
    by_partition = {p.partition: p for p in plans}
    assert by_partition[0].target == 110 and by_partition[0].token_ids == (1, 2)
    assert by_partition[1].target is None, "Kafka is already lower: never move forwards"
    assert by_partition[1].lowest_unfinished == 20


def test_no_kafka_offset_gets_none_from_the_ranges() -> None:
    """No offset vouches for the ranges (a re-created topic, a deleted group): auto.offset.reset decides.

    An offset set to the range's progress would make a plain consumer skip the records below it that
    ``earliest`` reads (on a re-created topic, records nobody ever read).
    """
    (plan,) = plan_rollback([_token(1, 0, 10, 300, 50)], {})
    assert (plan.kafka_before, plan.target, plan.token_ids) == (None, None, (1,))
    assert "no offset: auto.offset.reset decides" in format_rollback([plan], {}, dry_run=False)


def test_done_tokens_are_ignored() -> None:
    assert plan_rollback([_token(1, 0, 10, 300, 300, done=True)], {("t", 0): 300}) == []


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1_000), st.integers(1, 500), st.booleans()), max_size=8),
    st.dictionaries(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 2_000))),
    st.dictionaries(st.integers(0, 2), st.integers(0, 1_500)),
)
def test_never_forwards_never_below_the_log_start_and_covers_every_unfinished_offset(
    raw: list[tuple[int, int, int, bool]], kafka_raw: dict[int, int | None], starts_raw: dict[int, int]
) -> None:
    tokens = [_token(i + 1, p, s, s + n, s + n // 2, done=d) for i, (p, s, n, d) in enumerate(raw)]
    kafka = {("t", p): o for p, o in kafka_raw.items()}
    starts = {("t", p): o for p, o in starts_raw.items()}
    for plan in plan_rollback(tokens, kafka, None, starts):
        open_here = [t for t in tokens if t.is_open and t.partition == plan.partition]
        assert set(plan.token_ids) == {t.id for t in open_here}
        if plan.kafka_before is None:
            assert plan.target is None, "no offset vouches for the ranges: none is set from them"
            continue
        after = plan.target if plan.target is not None else plan.kafka_before
        log_start = starts.get(("t", plan.partition), 0)
        assert after <= plan.kafka_before
        assert plan.target is None or plan.target >= log_start, "below the log start auto.offset.reset decides"
        assert after <= max(log_start, min(t.progress.committed for t in open_here)), "an owed record skipped"


def _mirror(group: str, partition: int, *ranges: RangeProgress, key: bytes | None = None) -> str:
    text = encode_mirror(list(ranges), key=key, context=mirror_context(group, TopicPartitionKey("t", partition)))
    assert text is not None
    return text


def test_a_range_only_the_mirror_names_is_unfinished_from_its_start() -> None:
    # the store lost [10, 300); the mirror claims it is committed to 250: untrusted, so 10 counts
    metadata = {("t", 0): _mirror("g", 0, RangeProgress(10, 300, 250)), ("t", 1): None}
    lost = mirror_only_spans(metadata, [], "g", None, {("t", 0): 600}, "c1")
    assert lost == {("t", 0): [OffsetRange(10, 300)]}
    (plan,) = plan_rollback([], {("t", 0): 600}, lost)
    assert plan.target == 10 and plan.token_ids == () and plan.mirrored == (OffsetRange(10, 300),)


def test_spans_the_store_knows_are_not_taken_from_the_mirror() -> None:
    done = _token(1, 0, 10, 200, 200, done=True)
    metadata = {("t", 0): _mirror("g", 0, RangeProgress(10, 300, 10))}
    assert mirror_only_spans(metadata, [done], "g", None, {("t", 0): 300}, "c1") == {("t", 0): [OffsetRange(200, 300)]}


def test_a_done_range_the_offset_does_not_vouch_for_excuses_no_mirrored_span() -> None:
    """A store restored from a backup older than a re-created topic: its done range is another log's fact."""
    old, new = new_lineage("c1", b"old-lin1"), new_lineage("c1", b"new-lin2")
    stale = Token(1, "g", "t", 0, RangeProgress(100, 1100, 1100), state=TokenState.DONE, lineage=old)
    context = mirror_context("g", TopicPartitionKey("t", 0))
    mirror = encode_mirror([RangeProgress(500, 1100, 500)], context=context)
    assert mirror is not None
    metadata = {("t", 0): mark(mirror, new, 1101, context=context)}
    lost = mirror_only_spans(metadata, [stale], "g", None, {("t", 0): 1101}, "c1")
    assert lost == {("t", 0): [OffsetRange(500, 1100)]}
    same = Token(2, "g", "t", 0, RangeProgress(500, 1100, 1100), state=TokenState.DONE, lineage=new)
    assert mirror_only_spans(metadata, [same], "g", None, {("t", 0): 1101}, "c1") == {}, "vouched: the store's"
    moved = {("t", 0): 1200}  # the offset moved without the marker: it vouches for nothing
    assert mirror_only_spans(metadata, [same], "g", None, moved, "c1") == {("t", 0): [OffsetRange(500, 1100)]}


def test_foreign_or_unreadable_metadata_names_nothing() -> None:
    key = b"k" * 16
    signed = _mirror("g", 0, RangeProgress(10, 300, 10), key=key)
    offsets: dict[tuple[str, int], int | None] = {("t", 0): 300}
    assert mirror_only_spans({("t", 0): signed}, [], "other-group", key, offsets, "c1") == {}, "another group's"
    assert mirror_only_spans({("t", 0): signed}, [], "g", key, offsets, "c1") == {("t", 0): [OffsetRange(10, 300)]}
    assert mirror_only_spans({("t", 0): "fr1:!!!not base64"}, [], "g", None, offsets, "c1") == {}
    assert mirror_only_spans({("t", 0): "the application's own metadata"}, [], "g", None, offsets, "c1") == {}


def test_no_target_lies_below_the_log_start() -> None:
    """Retention removed the start of a range: below the log start a plain consumer goes to auto.offset.reset."""
    tokens = [_token(1, 0, 100, 300, 100), _token(2, 1, 100, 300, 150)]
    plans = plan_rollback(tokens, {("t", 0): 300, ("t", 1): 300}, None, {("t", 0): 200, ("t", 1): 120})
    assert [(p.partition, p.target) for p in plans] == [(0, 200), (1, 150)]
    (kept,) = plan_rollback([_token(1, 0, 100, 300, 100)], {("t", 0): 300}, None, {("t", 0): 300})
    assert kept.target is None, "retention removed everything the range owed: the offset stays"


def test_a_marker_synced_from_another_cluster_owes_everything_from_the_log_start() -> None:
    """MirrorMaker 2 copied the offset and the marker: the marker's ranges are the other cluster's offsets."""
    context = mirror_context("g", TopicPartitionKey("t", 0))
    mirror = encode_mirror([RangeProgress(1500, 2500, 1500)], context=context)
    metadata = {("t", 0): mark(mirror, new_lineage("elsewhere", b"lineage1"), 2800, context=context)}
    offsets: dict[tuple[str, int], int | None] = {("t", 0): 2500}
    lost = mirror_only_spans(metadata, [], "g", None, offsets, "here", {("t", 0): 40})
    assert lost == {("t", 0): [OffsetRange(40, 2500)]}
    (plan,) = plan_rollback([], offsets, lost, {("t", 0): 40})
    assert plan.target == 40
    own = {("t", 0): mark(mirror, new_lineage("here", b"lineage1"), 2500, context=context)}
    assert mirror_only_spans(own, [], "g", None, offsets, "here", {("t", 0): 40}) == {
        ("t", 0): [OffsetRange(1500, 2500)]
    }
