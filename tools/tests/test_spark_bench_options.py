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


def test_fresh_only_batches_are_timed_by_spark_until_the_drain() -> None:
    """The micro-batch the drain goal allows: batches with fresh records and no lag, before the lag drained."""
    from fastrecover_tools.spark_bench import _fresh_only_batches_s, _Tally

    tally = _Tally(started=0.0, lag_target=100, drained_s=2.0)
    tally.batches = [(0.5, 0, 40), (1.2, 60, 10), (2.0, 40, 5), (2.6, 0, 30)]
    tally.batch_ids = [7, 8, 9, 10]
    assert _fresh_only_batches_s(tally, {7: 0.45, 8: 0.6, 9: 0.7, 10: 0.5}) == 0.45, "only batch 7 counts"
    assert _fresh_only_batches_s(tally, {8: 0.6}) is None, "a batch Spark's progress no longer holds: not timed"


def test_drain_extra_is_paired_per_round_and_checked_against_the_fresh_batches() -> None:
    from fastrecover_tools.spark_bench import _paired

    spark = [{"first_fresh_s": 1.0, "drain_s": 2.0}, {"first_fresh_s": 1.1, "drain_s": 2.2}]
    ours = [
        {"first_fresh_s": 0.5, "drain_s": 2.4, "fresh_only_batches_s": 0.5},
        {"first_fresh_s": 0.6, "drain_s": 3.0, "fresh_only_batches_s": 0.5},
    ]
    out = _paired(spark, ours, "fastrecover-kafka")
    assert out["drain_extra_s"]["rounds"] == [0.4, 0.8]
    assert out["drain_within_one_batch"] == {"rounds": 2, "held": 1}
    assert _paired(spark, spark, "spark-kafka") == {}
