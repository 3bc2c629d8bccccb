"""plan_rollback (pure): where Kafka's offset goes when a group returns to plain consumers."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fastrecover.ranges import RangeProgress
from fastrecover.rollback import plan_rollback
from fastrecover.tokens import Token, TokenState


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


def test_no_kafka_offset_is_set_to_the_lowest_unfinished() -> None:
    (plan,) = plan_rollback([_token(1, 0, 10, 300, 50)], {})
    assert plan.kafka_before is None and plan.target == 50


def test_done_tokens_are_ignored() -> None:
    assert plan_rollback([_token(1, 0, 10, 300, 300, done=True)], {("t", 0): 300}) == []


@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 1_000), st.integers(1, 500), st.booleans()), max_size=8),
    st.dictionaries(st.integers(0, 2), st.one_of(st.none(), st.integers(0, 2_000))),
)
def test_never_forwards_and_covers_every_unfinished_offset(
    raw: list[tuple[int, int, int, bool]], kafka_raw: dict[int, int | None]
) -> None:
    tokens = [_token(i + 1, p, s, s + n, s + n // 2, done=d) for i, (p, s, n, d) in enumerate(raw)]
    kafka = {("t", p): o for p, o in kafka_raw.items()}
    for plan in plan_rollback(tokens, kafka):
        after = plan.target if plan.target is not None else plan.kafka_before
        assert after is not None
        if plan.kafka_before is not None:
            assert after <= plan.kafka_before
        open_here = [t for t in tokens if t.is_open and t.partition == plan.partition]
        assert after <= min(t.progress.committed for t in open_here)
        assert set(plan.token_ids) == {t.id for t in open_here}
