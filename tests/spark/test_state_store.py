"""The Spark tables in a real store (SQLite and PostgreSQL): query state and job claims."""

from __future__ import annotations

from fastrecover.spark.offsets import PartitionState, SourceOffset
from fastrecover.spark.state import ACTIVE, SparkState
from fastrecover.store import open_store
from fastrecover.tokens import TokenState
from fastrecover.tokens import TopicPartitionKey as K


def test_initial_offset_is_computed_once_and_then_stable(store_url: str) -> None:
    calls: list[int] = []

    def compute() -> str:
        calls.append(1)
        return SourceOffset({K("a", 0): PartitionState(5, 5)}).dumps()

    with open_store(store_url) as store:
        first = SparkState(store).initial_offset("q", compute)
        # A second SparkState (a restarted driver) creates nothing twice and answers the same.
        again = SparkState(store).initial_offset("q", lambda: "must not be called")
        assert first == again and len(calls) == 1
        assert SparkState(store).initial_offset("other", compute) == first and len(calls) == 2
        state = SparkState(store)
        assert state.committed_offset("q") is None
        state.record_commit("q", "{}")
        assert state.committed_offset("q") == "{}"


def test_a_claim_is_sticky_until_finished(store_url: str) -> None:
    with open_store(store_url) as store:
        one = store.create_range("g", "t", 0, 10, 20, "consumer-1")
        two = store.create_range("g", "t", 1, 0, 5, "consumer-1")
        state = SparkState(store)
        claim = state.claim_open_ranges("g", "job", "spark-ranges:job")
        assert claim.state == ACTIVE and claim.generation == 1
        assert {(r.token_id, r.epoch) for r in claim.ranges} == {(one.id, 2), (two.id, 2)}
        assert state.claim_open_ranges("g", "job", "spark-ranges:job") == claim  # no second epoch bump
        assert store.get(one.id).epoch == 2 and store.get(one.id).owner == "spark-ranges:job"
        state.finish_claim(claim, "completed")
        assert state.active_claim("g", "job") is None
        store.create_range("g", "t", 2, 0, 3, None)
        later = state.claim_open_ranges("g", "job", "spark-ranges:job")
        assert later.generation == 2 and len(later.ranges) == 3  # the first two are still open
        assert store.get(one.id).state is TokenState.OPEN
