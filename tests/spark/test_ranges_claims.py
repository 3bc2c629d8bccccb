"""A ranges job's claim in a real store (SQLite and PostgreSQL) when ``complete_ranges`` stops half way."""

from __future__ import annotations

from fastrecover.ranges import RangeProgress
from fastrecover.spark.ranges import claim_pieces, complete_ranges
from fastrecover.spark.state import ACTIVE, Claim, SparkState
from fastrecover.store import ProgressUpdate, RangeStore, open_store
from fastrecover.tokens import Token, TokenState

OWNER = "spark-ranges:default"


def _completed_but_not_closed(store: RangeStore) -> tuple[SparkState, Claim, Token, Token]:
    """A job claims two ranges, a consumer takes one back (its recovery on assignment), then the job's
    completion lands and the driver dies before closing the claim.  Returns the state, the claim, the range
    the job completed and the one the consumer holds."""
    mine = store.create_range("orders", "t", 0, 100, 200, "consumer-1")
    theirs = store.create_range("orders", "t", 1, 0, 50, "consumer-1")
    state = SparkState(store)
    claim = state.claim_open_ranges("orders", "default", OWNER)
    store.claim(theirs.id, "consumer-2")
    store.commit_progress(
        [ProgressUpdate(r.token_id, claim.owner, r.epoch, RangeProgress(r.start, r.end, r.end)) for r in claim.ranges]
    )
    return state, claim, mine, theirs


def test_a_claim_whose_completion_landed_but_not_its_close_is_not_read_again(store_url: str) -> None:
    with open_store(store_url) as store:
        state, claim, first, taken_back = _completed_but_not_closed(store)
        assert store.get(first.id).state is TokenState.DONE
        assert state.active_claim("orders", "default") == claim  # the close never happened
        later = store.create_range("orders", "t", 0, 300, 400, "consumer-1")  # a new lag, the next day

        again = state.claim_open_ranges("orders", "default", OWNER)

        # The next job of the same name reads the new lag (and the range the consumer holds), never the
        # range the first job completed.
        assert again.generation == claim.generation + 1 and again.state == ACTIVE
        assert {r.token_id for r in again.ranges} == {later.id, taken_back.id}
        assert all(p.start >= 300 or p.partition == 1 for p in claim_pieces(again.ranges))
        assert state.active_claim("orders", "default") == again
    completion = complete_ranges(store_url, "orders")
    assert [t.id for t in completion.completed] == [later.id, taken_back.id] and completion.fenced == []
    with open_store(store_url) as store:
        assert store.open_ranges("orders") == []


def test_complete_ranges_called_again_reports_what_its_first_call_completed(store_url: str) -> None:
    with open_store(store_url) as store:
        _state, _claim, mine, theirs = _completed_but_not_closed(store)

    completion = complete_ranges(store_url, "orders")

    assert [t.id for t in completion.completed] == [mine.id] and completion.fenced == [theirs.id]
    with open_store(store_url) as store:
        state = SparkState(store)
        assert state.active_claim("orders", "default") is None
        assert [t.id for t in store.open_ranges("orders")] == [theirs.id]  # the consumer's to finish
