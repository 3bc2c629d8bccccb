"""The instruction benchmark's pure parts: the per-record difference, the summary, callgrind's totals, the order."""

from __future__ import annotations

import pytest

from fastrecover_tools.bench.steady_instructions import (
    callgrind_total,
    inclusive_cost,
    per_record,
    ratio,
    rotated,
    summarize,
    wrapper_share,
)


def test_per_record_cancels_the_fixed_cost() -> None:
    fixed, cost = 1_000_000, 6_500
    small = (10_000, fixed + 10_000 * cost)
    large = (60_000, fixed + 60_000 * cost)
    assert per_record(small, large) == cost


def test_per_record_uses_the_records_actually_read() -> None:
    # consume() may return a few records more than asked for; the difference divides by what came
    assert per_record((10_000, 20_000_000), (60_500, 121_000_000)) == pytest.approx(2_000.0)


def test_per_record_refuses_runs_in_the_wrong_order() -> None:
    with pytest.raises(ValueError, match="more records"):
        per_record((60_000, 2), (10_000, 1))


def test_summarize_median_and_spread() -> None:
    got = summarize([100.0, 101.0, 99.0, 100.5, 100.0])
    assert got == {"median": 100.0, "min": 99.0, "max": 101.0, "spread": 0.02}


def test_summarize_even_count_takes_the_middle_mean() -> None:
    assert summarize([1.0, 3.0])["median"] == 2.0


def test_summarize_refuses_nothing() -> None:
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_rounds_to_four_places() -> None:
    assert ratio(1.0, 3.0) == 0.3333


def test_callgrind_total_prefers_totals() -> None:
    text = "version: 1\ncmd: python\nthread: 1\nevents: Ir\nsummary: 42\n\nfn=(1) main\n5 42\n\ntotals: 41\n"
    assert callgrind_total(text) == 41
    assert callgrind_total(text.replace("totals: 41\n", "")) == 42


def test_callgrind_total_refuses_other_events() -> None:
    with pytest.raises(ValueError, match="Ir"):
        callgrind_total("events: Dr Dw\ntotals: 1 2\n")
    with pytest.raises(ValueError, match="totals"):
        callgrind_total("events: Ir\n")


def test_rotated_starts_each_repeat_with_another_variant() -> None:
    names = ["plain", "a", "b"]
    assert [rotated(names, r)[0] for r in range(4)] == ["plain", "a", "b", "plain"]
    assert sorted(rotated(names, 2)) == sorted(names)


ANNOTATED = """\
--------------------------------------------------------------------------------
Ir                   file:function
--------------------------------------------------------------------------------
73,937,114 (100.0%)  /src/Python/ceval.c:_PyEval_EvalFrameDefault [/lib/libpython3.11.so.1.0]
54,748,358 (74.05%)  ???:Consumer_consume [/site-packages/confluent_kafka/cimpl.so]
 6,465,241 ( 8.74%)  /src/Objects/listobject.c:list_dealloc [/lib/libpython3.11.so.1.0]
 6,232,047 ( 8.43%)  ???:Message_dealloc [/site-packages/confluent_kafka/cimpl.so]
 1,000 ( 0.01%)  ???:Message_dealloc'2 [/site-packages/confluent_kafka/cimpl.so]
 1,040,000 ( 1.41%)  ???:Message_value [/site-packages/confluent_kafka/cimpl.so]
"""


def test_inclusive_cost_sums_the_named_functions_only() -> None:
    assert inclusive_cost(ANNOTATED, ("Consumer_consume", "Message_dealloc")) == 54_748_358 + 6_232_047
    assert inclusive_cost(ANNOTATED, ("Consumer_poll",)) == 0


def test_wrapper_share_is_a_fraction_of_the_reference_whole() -> None:
    assert wrapper_share(700.0, 650.0, 3600.0) == round(50 / 3600, 5)
    assert wrapper_share(650.0, 700.0, 3600.0) < 0
