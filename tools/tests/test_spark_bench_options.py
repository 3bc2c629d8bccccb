"""The Spark bench's per-source options: pure, no broker and no Spark."""

from __future__ import annotations

from fastrecover_tools.spark_bench import NO_JUMP_MIN_OFFSETS, SOURCES, _options


def _opts(source: str) -> dict[str, str]:
    return _options(source, "broker:9092", "orders", "sqlite:///x.db", "q")


def test_spark_source_gets_none_of_ours() -> None:
    opts = _opts("spark-kafka")
    assert opts == {
        "kafka.bootstrap.servers": "broker:9092",
        "subscribe": "orders",
        "startingOffsets": "latest",
        "failOnDataLoss": "true",
    }


def test_kafka_stream_variants_run_with_start_kafka_streams_defaults() -> None:
    for source in ("fastrecover-kafka", "fastrecover-kafka-no-jump"):
        opts = _opts(source)
        assert "maxBackfillOffsetsPerTrigger" not in opts and "backfillTasks" not in opts, source
    assert "fastrecover.backfill.min.offsets" not in _opts("fastrecover-kafka")


def test_no_jump_threshold_is_above_any_lag_and_the_only_difference() -> None:
    jump, no_jump = _opts("fastrecover-kafka"), _opts("fastrecover-kafka-no-jump")
    assert int(no_jump.pop("fastrecover.backfill.min.offsets")) == NO_JUMP_MIN_OFFSETS >= 2**62
    assert no_jump == jump
    assert "fastrecover-kafka-no-jump" in SOURCES
