"""Fault 6: retention deletes part of an open range before it is backfilled."""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from fastrecover.store import open_store
from fastrecover_tools.chaos.report import format_result
from fastrecover_tools.testing.waiting import wait_for
from tests.faults.conftest import GROUP_PROTOCOLS, SCRIPTED, DriverFactory, crash_with_lag, verdict_ok

pytestmark = pytest.mark.faults


@pytest.mark.parametrize("group_protocol", GROUP_PROTOCOLS)
def test_retention_inside_an_open_range_is_counted_and_reported(
    chaos_driver: DriverFactory, group_protocol: str
) -> None:
    driver = chaos_driver(
        **SCRIPTED,
        rate=300.0,
        stall_share=0.0,
        fail_child_share=0.0,
        group_protocol=group_protocol,
    )
    crash_with_lag(driver, finished=150, lag=900)  # 300 records per partition
    # the second incarnation opens the ranges and dies after 10 backfilled records
    second = driver.spawn(
        0, faults=False, extra=["--commit", "message", "--stall-at", "backfill", "--stall-after", "10"]
    )
    wait_for(lambda: second.has("stalled"), 60, 0.05, "the second incarnation to stall mid-range")
    driver.kill(0)
    with open_store(driver.config.store_url) as store:
        ranges = store.open_ranges(driver.group)
    assert ranges
    # retention removes the first half of what is left of every open range
    cut = [TopicPartition(t.topic, t.partition, t.progress.committed + t.progress.remaining // 2) for t in ranges]
    admin = AdminClient({"bootstrap.servers": driver.config.bootstrap})
    for fut in admin.delete_records(cut).values():
        fut.result(timeout=30)

    third = driver.spawn(0, faults=False, extra=["--commit", "sync"])
    result = driver.finish()
    table = verdict_ok(result)
    v = result.verdict
    assert v.ok, table
    assert v.retention_deleted_unfinished > 0, table
    assert v.skipped_recorded >= v.retention_deleted_unfinished, table
    assert v.unaccounted == 0, table
    assert "skipped recorded on range tokens" in format_result(result)
    # the incarnations from the third on: under KIP-848 a restart the broker fenced (the killed static
    # member not yet expired: a fatal error) exits and is restarted
    first_after = int(third.name.split("#")[1])
    log_text = "".join(
        p.read_text(errors="replace")
        for p in (driver.workdir / "logs").glob("m1-*.log")
        if int(p.stem.split("-")[1]) >= first_after
    )
    assert "retention deleted" in log_text and "recorded on the token" in log_text, log_text[-3000:]
    with open_store(driver.config.store_url) as store:
        skipped = {t.id: t.skipped for t in store.ranges(driver.group)}
    assert all(skipped[t.id] > 0 for t in ranges if t.progress.remaining // 2 > 0), skipped
