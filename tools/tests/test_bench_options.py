"""``fastrecover bench`` arguments and the shape of the matrix: pure, no broker."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from fastrecover.errors import ConfigError
from fastrecover_tools.bench import command
from fastrecover_tools.bench.patterns import PATTERNS, STEADY_CELLS, consumer_config, hooks
from fastrecover_tools.bench.run import (
    FULL,
    QUICK,
    BenchOptions,
    _mode_order,
    byte_compile,
    restart_cells,
    run_timeout,
)


def _options(*argv: str) -> BenchOptions:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    opts = command.options_from_args(parser.parse_args(list(argv)), ["bench", *argv])
    assert isinstance(opts, BenchOptions)
    return opts


def test_defaults_are_the_full_matrix() -> None:
    opts = _options()
    assert opts.sizes == FULL and opts.repeats == 3 and opts.patterns == list(PATTERNS)
    assert opts.sizes.steady_repeats >= 3
    cells = restart_cells(opts)
    assert ("auto", FULL.ttf_lag, "ttf") in cells
    for pattern in PATTERNS:
        lags = FULL.sync_lags if pattern == "msg-sync" else FULL.lags
        assert [lag for p, lag, role in cells if p == pattern and role == "drain"] == lags
    assert len(cells) == 13


def test_profile_needs_its_own_outputs() -> None:
    opts = _options("--quick", "--profile", "/tmp/p", "--out", "/tmp/o", "--doc", "")
    assert opts.profile is not None and opts.doc is None


def test_quick_and_overrides() -> None:
    opts = _options("--quick", "--lags", "1000,2000", "--patterns", "auto,msg-sync")
    assert opts.repeats == 2 and opts.sizes.steady_records == QUICK.steady_records
    assert opts.sizes.lags == [1000, 2000] and opts.patterns == ["auto", "msg-sync"]
    assert _options("--quick", "--repeats", "4").repeats == 4


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--patterns", "auto,nope"], "nope"),
        (["--only", "restart,bogus"], "bogus"),
        (["--repeats", "0"], "--repeats"),
        (["--work-us", "-1"], "--work-us"),
        (["--profile", "/tmp/p"], "--profile"),
    ],
)
def test_bad_arguments_name_the_culprit(argv: list[str], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _options(*argv)


def test_mode_order_alternates_between_repeats_and_cells() -> None:
    assert _mode_order(0, 0) == ("plain", "fastrecover")
    assert _mode_order(1, 0) == ("fastrecover", "plain")
    assert _mode_order(0, 1) == ("fastrecover", "plain")
    firsts = [_mode_order(rep, 0)[0] for rep in range(4)]
    assert firsts.count("plain") == firsts.count("fastrecover") == 2


def test_run_timeout_grows_with_lag_and_is_longer_for_sync() -> None:
    assert run_timeout("auto", 1_000_000, 60) == pytest.approx(160)
    assert run_timeout("msg-sync", 10_000, 60) > run_timeout("msg-async", 10_000, 60)


def test_every_pattern_has_hooks_and_steady_cells_cover_all() -> None:
    class Fake:
        def __init__(self) -> None:
            self.calls: list[tuple[str, dict[str, object]]] = []

        def commit(self, **kwargs: object) -> None:
            self.calls.append(("commit", kwargs))

        def store_offsets(self, **kwargs: object) -> None:
            self.calls.append(("store_offsets", kwargs))

    expected = {
        "auto": [],
        "msg-async": [("commit", {"message": "m", "asynchronous": True})],
        "msg-sync": [("commit", {"message": "m", "asynchronous": False})],
        "batch-async": [("commit", {"asynchronous": True})],
        "batch-sync": [("commit", {"asynchronous": False})],
        "store": [("store_offsets", {"message": "m"})],
    }
    for name in PATTERNS:
        fake = Fake()
        on_message, on_batch = hooks(fake, name)
        if on_message is not None:
            on_message("m")
        if on_batch is not None:
            on_batch()
        assert fake.calls == expected[name], name
    assert consumer_config("store") == {"enable.auto.offset.store": False}
    assert consumer_config("msg-async") == {"enable.auto.commit": False}
    assert {p for _api, p in STEADY_CELLS} == set(PATTERNS)
    with pytest.raises(ValueError, match="nope"):
        hooks(Fake(), "nope")


def test_batch_commit_with_nothing_to_commit_is_no_error() -> None:
    from confluent_kafka import KafkaError, KafkaException

    class Raising:
        def __init__(self, code: int) -> None:
            self.code = code

        def commit(self, **_kwargs: object) -> None:
            raise KafkaException(KafkaError(self.code))

    for pattern in ("batch-async", "batch-sync"):
        _on_message, on_batch = hooks(Raising(KafkaError._NO_OFFSET), pattern)
        assert on_batch is not None
        on_batch()  # nothing consumed since the last commit: skipped, as an application would
        _on_message, on_batch = hooks(Raising(KafkaError._TRANSPORT), pattern)
        assert on_batch is not None
        with pytest.raises(KafkaException):
            on_batch()


def test_summarize_pair_pairs_repeats_and_keeps_failures() -> None:
    from fastrecover_tools.bench.run import summarize_pair

    plain: list[dict[str, Any]] = [
        {"records_per_s": 100.0, "drain_s": 10.0, "assignments": 1},
        {"records_per_s": 200.0, "drain_s": 5.0},
    ]
    fast: list[dict[str, Any]] = [
        {"error": "TimeoutError: x"},
        {"records_per_s": 190.0, "drain_s": 5.5, "assignments": 2},
    ]
    cell = summarize_pair(plain, fast)
    assert cell["ratio_records_per_s"]["values"] == [0.95]  # repeat 1 failed: only repeat 2 pairs
    assert cell["errors"] == {"plain": [], "fastrecover": ["TimeoutError: x"]}
    assert cell["rebalanced"] == {"plain": 0, "fastrecover": 1}
    assert cell["plain"]["records_per_s"]["median"] == 150.0


def test_byte_compile_writes_the_bytecode_the_workers_read() -> None:
    """The workers import fastrecover from cached bytecode, as an installed package does (run.byte_compile)."""
    import fastrecover.consumer

    cached = Path(importlib.util.cache_from_source(fastrecover.consumer.__file__))
    cached.unlink(missing_ok=True)
    assert byte_compile()
    assert cached.is_file()
