"""``fastrecover rollback`` on the real broker: back to plain consumers after a crash mid-backfill, 0 lost."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient

from fastrecover.cli import main
from fastrecover.codec import new_lineage
from fastrecover.store import open_store
from fastrecover_tools.testing.broker import create_topic, delete_topic, group_is_empty, produce
from fastrecover_tools.testing.waiting import wait_for
from tests.integration.helpers import SESSION_MS, group_offsets, lag_after_crash, plain_reads
from tests.integration.procs import WorkerProcess

LOG_END = 300
EXTRA = 100


def _ledger(path: Path) -> set[int]:
    if not path.exists():
        return set()
    return {int(line.split()[2]) for line in path.read_text().splitlines() if line.strip()}


def _rollback(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["rollback", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("store_lost", [False, True], ids=["store", "store-lost"])
def test_rollback_after_a_kill_mid_backfill_loses_nothing(
    store_lost: bool,
    bootstrap: str,
    topic_factory: Any,
    unique_group: str,
    store_url: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    topic = topic_factory(partitions=1)
    # first process: commits 10 and dies at 50; the log grows to 300 while nobody consumes
    lag_after_crash(
        bootstrap, topic, unique_group, store_url, tmp_path, produced=50, commit_at=10, block_at=50, log_end=LOG_END
    )
    # second process: recovers [10, 300) (the primary jumps to 300), reads and commits new records past
    # 300 while the child backfills slowly, and is SIGKILLed after 250 backfilled records
    worker = WorkerProcess(
        [
            "--bootstrap",
            bootstrap,
            "--topic",
            topic,
            "--group",
            unique_group,
            "--parallel",
            "--store-url",
            store_url,
            "--min-offsets",
            "10",
            "--ledger",
            str(tmp_path / "ledger2"),
            "--member",
            "w2",
            "--commit",
            "message",
            "--work-us",
            "10000",
            "--batch",
            "10",
            "--stall-at",
            "backfill",
            "--stall-after",
            "250",
            "--session-ms",
            str(SESSION_MS),
        ],
        tmp_path / "worker2.log",
    )
    common = ["--group", unique_group, "--store-url", store_url, "--bootstrap-servers", bootstrap, "--timeout", "10"]
    try:
        # recovery, not the assignment: the application's on_assign runs before recovery reads the log end
        worker.wait_event("recovery", 60)
        produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END, LOG_END + EXTRA)], partition=0)
        worker.wait_event("stalled", 120)
        # a live member: rollback must refuse and change nothing
        code, _, err = _rollback(capsys, *common)
        assert code == 2
        assert "active member" in err and len(err.strip().splitlines()) == 1
    finally:
        worker.sigkill()
    wait_for(lambda: group_is_empty(bootstrap, unique_group), 30, 0.2, "the killed member to leave")

    with open_store(store_url) as store:
        (token,) = store.open_ranges(unique_group)
        if store_lost:  # the store lost the range (wiped, an old backup): only the mirror still names it
            assert store.delete_open(unique_group, [token.id]) == 1
    assert (token.progress.start, token.progress.end) == (10, LOG_END)
    # the mirror is untrusted: a range only it names is unfinished from its start
    lowest = token.progress.start if store_lost else token.progress.committed
    (before,) = group_offsets(bootstrap, unique_group, topic)
    assert before.offset > lowest, "the primary committed past the open range: a plain consumer would skip it"
    assert (before.metadata or "").startswith("fr2:"), "the range is mirrored behind the marker"

    # dry run: a table, no change
    code, out, _ = _rollback(capsys, *common, "--dry-run")
    assert code == 0
    assert "would move back" in out and str(lowest) in out
    assert group_offsets(bootstrap, unique_group, topic)[0].offset == before.offset
    with open_store(store_url) as store:
        assert [t.id for t in store.open_ranges(unique_group)] == ([] if store_lost else [token.id])

    code, out, err = _rollback(capsys, *common)
    assert code == 0, err
    named = f"mirror [10, {LOG_END})" if store_lost else f"#{token.id}"
    assert "moved back" in out and named in out
    assert group_offsets(bootstrap, unique_group, topic)[0].offset == lowest
    with open_store(store_url) as store:
        assert store.open_ranges(unique_group) == []

    # a second rollback has nothing left to do
    code, out, _ = _rollback(capsys, *common)
    assert code == 0 and "nothing to roll back" in out

    # the way back: a plain consumer of the group gets every record nobody processed
    processed = _ledger(tmp_path / "ledger") | _ledger(tmp_path / "ledger2")
    end = LOG_END + EXTRA
    assert processed & set(range(LOG_END, end)), "the primary processed records past the range"
    never_processed = set(range(end)) - processed
    assert never_processed, "the scenario must leave unprocessed records"
    plain = PlainConsumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_group,
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",  # a plain consumer that fell back to the end would lose the lag
        }
    )
    received: list[int] = []
    try:
        plain.subscribe([topic])

        def drained() -> bool:
            for m in plain.consume(500, 0.2):
                if m.error() is None:
                    received.append(m.offset() or 0)
            return bool(received) and max(received) >= end - 1

        wait_for(drained, 60, 0.001, "the plain consumer to read to the log end")
    finally:
        plain.close()
    assert min(received) == lowest
    lost = never_processed - set(received)
    assert lost == set(), f"{len(lost)} records lost, e.g. {sorted(lost)[:10]}"


def test_rollback_of_a_group_without_ranges(
    bootstrap: str, unique_group: str, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    open_store(store_url).close()
    code, out, _ = _rollback(
        capsys, "--group", unique_group, "--store-url", store_url, "--bootstrap-servers", bootstrap
    )
    assert code == 0
    assert "nothing to roll back" in out


def test_rollback_with_an_unreachable_broker_is_one_line_and_bounded(
    store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import time

    began = time.monotonic()
    code, _, err = _rollback(
        capsys, "--group", "g", "--store-url", store_url, "--bootstrap-servers", "127.0.0.1:1", "--timeout", "2"
    )
    assert code == 2
    assert time.monotonic() - began < 10
    assert err.startswith("fastrecover: error: no Kafka broker answered") and len(err.strip().splitlines()) == 1


def test_plain_commit_metadata_is_cleared(bootstrap: str, topic_factory: Any, unique_group: str) -> None:
    """Rollback leaves no commit-metadata mirror behind (it would re-create ranges if the mode came back)."""
    # covered by the alter: an offset altered through the admin API carries empty metadata
    topic = topic_factory(partitions=1)
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, 5, metadata="fr1:Jxx")], asynchronous=False)
    finally:
        plain.close()
    from fastrecover.rollback import PartitionRollback, admin_client, move_offsets

    admin = admin_client(bootstrap)
    errors = move_offsets(admin, unique_group, [PartitionRollback(topic, 0, 5, 3, 3, (1,))], bootstrap, 10)
    assert errors == {}
    (after,) = group_offsets(bootstrap, unique_group, topic)
    assert after.offset == 3
    assert not after.metadata


def test_rollback_leaves_the_ranges_of_another_cluster_sharing_the_store(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two clusters, one store, the same names: only this cluster's ranges move its offsets and are deleted."""
    topic = topic_factory(partitions=1)
    here = _read_to_the_end(bootstrap, topic, unique_group)
    with open_store(store_url) as store:
        ours = store.create_range(unique_group, topic, 0, 100, LOG_END, "gone", new_lineage(here, os.urandom(8)))
        theirs = store.create_range(unique_group, topic, 0, 50, 80, "far", new_lineage("OtherClusterId", bytes(8)))

    code, out, err = _rollback(
        capsys, "--group", unique_group, "--store-url", store_url, "--bootstrap-servers", bootstrap
    )

    assert code == 0, err
    assert group_offsets(bootstrap, unique_group, topic)[0].offset == 100, "moved to this cluster's range only"
    with open_store(store_url) as store:
        assert [t.id for t in store.open_ranges(unique_group)] == [theirs.id]
        assert store.get(theirs.id).owner == "far"
    assert f"#{ours.id}" in out and f"#{theirs.id}" not in out


def test_rollback_after_a_re_created_topic_leaves_the_new_topic_to_auto_offset_reset(
    bootstrap: str, unique_group: str, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """An open range of the topic's old incarnation sets no offset on the new one: a plain consumer reads it all.

    Kafka deleted the group's offsets with the old topic, so nothing vouches for the range; an offset set
    from its progress made the plain consumer skip the new topic's records below it, which nobody had read.
    """
    topic = f"t-rollback-recreated-{unique_group[-20:]}"
    create_topic(bootstrap, topic, 1)
    try:
        plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": unique_group})
        try:
            here = plain.list_topics(timeout=30).cluster_id
        finally:
            plain.close()
        with open_store(store_url) as store:
            old = store.create_range(unique_group, topic, 0, 100, LOG_END, "gone", new_lineage(here, os.urandom(8)))
        delete_topic(bootstrap, topic)
        create_topic(bootstrap, topic, 1)
        produce(bootstrap, topic, [f"new{i}" for i in range(LOG_END)], partition=0)

        code, out, err = _rollback(
            capsys, "--group", unique_group, "--store-url", store_url, "--bootstrap-servers", bootstrap
        )

        assert code == 0, err
        (after,) = group_offsets(bootstrap, unique_group, topic)
        plain_reads(bootstrap, unique_group, topic, set(range(LOG_END)), "earliest")
        assert after.offset < 0, f"no offset set from the old incarnation's range (it is {after.offset})"
        assert f"#{old.id}" in out and "no offset: auto.offset.reset decides" in out
        with open_store(store_url) as store:
            assert store.open_ranges(unique_group) == [], "the range is folded away"
    finally:
        delete_topic(bootstrap, topic)


def _read_to_the_end(bootstrap: str, topic: str, group: str) -> str | None:
    """LOG_END records in partition 0, the group's offset committed at the end (plain); the cluster's id."""
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        plain.commit(offsets=[TopicPartition(topic, 0, LOG_END)], asynchronous=False)
        cluster: str | None = plain.list_topics(timeout=30).cluster_id
        return cluster
    finally:
        plain.close()


def test_rollback_never_sets_an_offset_below_the_log_start(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Retention removed the start of an open range: the offset goes to the log start, not below it.

    Below the log start, a plain consumer's fetch is out of range and ``auto.offset.reset`` decides: under
    ``latest`` (librdkafka's default) it went past every record the range still owed.
    """
    topic = topic_factory(partitions=1)
    here = _read_to_the_end(bootstrap, topic, unique_group)
    with open_store(store_url) as store:
        store.create_range(unique_group, topic, 0, 100, LOG_END, "gone", new_lineage(here, os.urandom(8)))
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 200)]).values():
        future.result(30)

    code, out, err = _rollback(
        capsys, "--group", unique_group, "--store-url", store_url, "--bootstrap-servers", bootstrap
    )

    assert code == 0, err
    assert group_offsets(bootstrap, unique_group, topic)[0].offset == 200, out
    plain_reads(bootstrap, unique_group, topic, set(range(200, LOG_END)), "latest")
