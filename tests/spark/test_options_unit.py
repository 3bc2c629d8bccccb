"""Options of the Spark sources (Spark's names, the kafka.* rules, secrets) and the pure planning helpers
they drive: live limits (maxOffsetsPerTrigger), minPartitions, JSON starting offsets, JVM read layers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrecover.errors import ConfigError
from fastrecover.spark.jvm import layers
from fastrecover.spark.kafka import RANGE_READ_DEFAULTS, _merged
from fastrecover.spark.offsets import LogBounds, PartitionState, Piece, SourceOffset
from fastrecover.spark.options import parse_ranges_options, parse_source_options
from fastrecover.spark.planning import advance_live, chunk_tasks, initial_offset
from fastrecover.tokens import TopicPartitionKey as K

BASE = {"kafka.bootstrap.servers": "b:9092", "fastrecover.query": "q"}


def parse(**options: str) -> object:
    merged = {**BASE, **{k.replace("__", "."): v for k, v in options.items()}}
    return parse_source_options({k.lower(): v for k, v in merged.items()})


def test_spark_option_names_are_parsed() -> None:
    opts = parse(
        assign='{"a":[1,0],"b":[2]}',
        startingOffsets='{"a":{"0":5,"1":-2},"b":{"2":-1}}',
        maxOffsetsPerTrigger="1000",
        minPartitions="6",
        includeHeaders="true",
    )
    assert opts.assign == (("a", 0), ("a", 1), ("b", 2))  # type: ignore[attr-defined]
    assert opts.topics == ("a", "b")  # type: ignore[attr-defined]
    assert opts.starting == "json" and opts.starting_specific == (("a", 0, 5), ("a", 1, -2), ("b", 2, -1))  # type: ignore[attr-defined]
    assert (opts.max_live, opts.min_partitions, opts.include_headers) == (1000, 6, True)  # type: ignore[attr-defined]
    pattern = parse(subscribePattern="orders-.*")
    assert pattern.matches("orders-eu") and not pattern.matches("payments")  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({}, "subscribe"),
        ({"subscribe": "a", "assign": '{"a":[0]}'}, "assign"),
        ({"subscribe": "a", "subscribePattern": "a.*"}, "subscribePattern"),
        ({"subscribePattern": "("}, "subscribePattern"),
        ({"assign": "[0]"}, "assign"),
        ({"assign": '{"a":["x"]}'}, "assign"),
        ({"subscribe": "a", "startingOffsets": "newest"}, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"a":{"0":-3}}'}, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"b":{"0":1}}'}, "startingOffsets"),
        ({"assign": '{"a":[0]}', "startingOffsets": '{"a":{"1":1}}'}, "startingOffsets"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger"),
        ({"subscribe": "a", "minPartitions": "x"}, "minPartitions"),
        ({"subscribe": "a", "includeHeaders": "yes"}, "includeHeaders"),
        ({"subscribe": "a", "endingOffsets": "latest"}, "endingOffsets"),
    ],
)
def test_bad_options_name_the_option(options: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse(**options)


@pytest.mark.parametrize(
    "key",
    [
        "plugin.library.paths",
        "sasl.kerberos.kinit.cmd",
        "ssl.engine.location",
        "interceptor.classes",
        "sasl.login.callback.handler.class",
        "Plugin.Library.Paths",
    ],
)
def test_keys_that_load_code_or_run_commands_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=f"(?i)kafka.{key}.*refused"):
        parse(subscribe="a", **{"kafka." + key: "/tmp/evil.so"})
    with pytest.raises(ConfigError, match="refused"):
        parse_ranges_options({"kafka.bootstrap.servers": "b", "group": "g", ("kafka." + key).lower(): "x"})


@pytest.mark.parametrize("key", ["auto.offset.reset", "group.id", "enable.auto.commit", "enable.partition.eof"])
def test_keys_the_source_owns_are_refused(key: str) -> None:
    with pytest.raises(ConfigError, match=f"kafka.{key}"):
        parse(subscribe="a", **{"kafka." + key: "latest"})


def test_read_defaults_that_detect_data_loss_are_applied_last() -> None:
    merged = _merged({"bootstrap.servers": "b", "auto.offset.reset": "earliest", "fetch.wait.max.ms": "500"})
    for key, value in RANGE_READ_DEFAULTS.items():
        assert merged[key] == value
    assert merged["auto.offset.reset"] == "error"
    assert merged["fetch.wait.max.ms"] == "500"  # a tuning default the user may change


def test_repr_never_shows_a_secret() -> None:
    opts = parse(
        subscribe="a",
        kafka__sasl__password="hunter2-kafka",
        kafka__ssl__key__password="hunter3-key",
        kafka__sasl__jaas__config='... password="hunter4-jaas";',
        fastrecover__store__url="postgresql+psycopg://app:hunter5-pg@db/x?sslpassword=hunter6-ssl",
    )
    ranges = parse_ranges_options(
        {
            "kafka.bootstrap.servers": "b",
            "group": "g",
            "kafka.sasl.password": "hunter7",
            "fastrecover.store.url": "postgresql://u:hunter8@h/d",
        }
    )
    text = repr(opts) + str(opts) + repr(ranges)
    for secret in ("hunter2", "hunter3", "hunter4", "hunter5", "hunter6", "hunter7", "hunter8"):
        assert secret not in text
    assert "sasl.password" in text and "***" in text and "app:***@db" in text


def test_a_malformed_store_url_error_masks_its_password() -> None:
    with pytest.raises(ConfigError) as err:
        parse(subscribe="a", fastrecover__store__url="no-scheme?password=hunter9")
    assert "hunter9" not in str(err.value)


# -- planning helpers -------------------------------------------------------------------------


@given(
    waiting=st.lists(st.integers(0, 10_000), min_size=1, max_size=6),
    limit=st.integers(1, 20_000),
)
def test_max_offsets_per_trigger_bounds_live_records_and_never_moves_back(waiting: list[int], limit: int) -> None:
    offset = SourceOffset({K("t", i): PartitionState(0, 100) for i in range(len(waiting))})
    ends = {K("t", i): 100 + n for i, n in enumerate(waiting)}
    out = advance_live(offset, ends, limit)
    took = {k: out.partitions[k].live - 100 for k in offset.partitions}
    assert all(0 <= took[k] <= ends[k] - 100 for k in took)
    total, with_records = sum(waiting), sum(1 for n in waiting if n)
    assert sum(took.values()) == min(total, max(limit, min(with_records, total)))
    if total <= limit:
        assert out == advance_live(offset, ends)


def test_json_starting_offsets_resolve_earliest_latest_and_clamp() -> None:
    bounds = {K("a", 0): LogBounds(10, 50), K("a", 1): LogBounds(0, 40), K("a", 2): LogBounds(5, 9)}
    got = initial_offset(bounds, "json", {K("a", 0): -2, K("a", 1): -1, K("a", 2): 100})
    assert {k.partition: s.live for k, s in got.partitions.items()} == {0: 10, 1: 40, 2: 9}
    with pytest.raises(ValueError, match=r"a\[2\]"):
        initial_offset(bounds, "json", {K("a", 0): 1, K("a", 1): 1})


def test_min_partitions_cuts_live_records_into_at_least_that_many_tasks() -> None:
    pieces = [Piece("a", 0, 0, 1000, False), Piece("a", 1, 0, 10, False)]
    tasks = chunk_tasks(pieces, backfill_tasks=2, min_live_tasks=5)
    assert len(tasks) >= 5
    assert sorted((p.partition, o) for t in tasks for p in t for o in range(p.start, p.end)) == sorted(
        (p.partition, o) for p in pieces for o in range(p.start, p.end)
    )


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 1000), st.integers(1, 50), st.booleans()), min_size=0, max_size=12
    )
)
def test_jvm_read_layers_read_every_piece_once_one_range_per_partition(raw: list[tuple[int, int, int, bool]]) -> None:
    pieces = [Piece("t", p, s, s + n, b) for p, s, n, b in raw]
    got = layers(pieces)
    flat = [p for layer in got for p in layer]
    assert sorted(flat, key=repr) == sorted(pieces, key=repr)
    for layer in got:
        assert len({p.partition for p in layer}) == len(layer)
        assert len({p.backfill for p in layer}) == 1
