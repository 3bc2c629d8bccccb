"""Failing over to a replica cluster: a group's offset synced from another Kafka cluster, marker and all.

MirrorMaker 2 (``sync.group.offsets.enabled``) copies a group's committed offsets to the replica
cluster, translated to the replica's offsets, with their metadata as committed.  A fastrecover
group's committed offset on the source lies above the ranges its child had not finished, which the
marker in that metadata lists (in the source's offsets).  On the replica those records sit at
offsets nobody can translate from here, below the synced offset: started there, a consumer skips
them for good.  Backup tools that restore a cluster's topics and group offsets into a new cluster do
the same, without the translation.

The replica here is the test broker; the source cluster is the one the copied marker names.  The
records are laid out as MirrorMaker leaves them: the replica's offsets are the source's less a
shift (the source had records before the replication began).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from confluent_kafka import Consumer as PlainConsumer
from confluent_kafka import TopicPartition

from fastrecover import Consumer
from fastrecover.cli import main
from fastrecover.codec import MARKED_MIRROR_LIMIT, encode_mirror, mark, new_lineage
from fastrecover.ranges import RangeProgress
from fastrecover.store import upgrade
from fastrecover_tools.testing.broker import produce
from tests.integration.helpers import group_offsets, parallel_config, plain_reads, read_all

pytestmark = pytest.mark.integration

#: the source cluster's offsets of its group: the child's unfinished range, and the committed offset above it
SOURCE_RANGE, SOURCE_COMMITTED = RangeProgress.fresh(1_500, 2_500), 2_800
#: the replica's offset = the source's - SHIFT (the source had SHIFT records before replication began)
SHIFT = 300
LOG_END = 3_000


def _failed_over(bootstrap: str, topic_factory: Any, group: str) -> str:
    """The replica's topic and the group's synced offset, with the source's marker as MirrorMaker copies it."""
    topic: str = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(LOG_END)], partition=0)
    source_lineage = new_lineage("source-cluster-id", os.urandom(8))
    metadata = mark(encode_mirror([SOURCE_RANGE], MARKED_MIRROR_LIMIT), source_lineage, SOURCE_COMMITTED)
    synced = TopicPartition(topic, 0, SOURCE_COMMITTED - SHIFT, metadata=metadata)
    plain = PlainConsumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        plain.commit(offsets=[synced], asynchronous=False)
    finally:
        plain.close()
    (copied,) = group_offsets(bootstrap, group, topic)
    assert (copied.offset, copied.metadata) == (synced.offset, metadata)
    return topic


#: every record at or after where the source's unfinished range lies on the replica
_OWED_ON_THE_REPLICA = set(range(SOURCE_RANGE.start - SHIFT, LOG_END))


def test_a_synced_offset_above_the_sources_unfinished_ranges_is_read_from_the_replicas_log_start(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """The store is open at the assignment: the lag from the log start is split off, the child backfills it."""
    topic = _failed_over(bootstrap, topic_factory, unique_group)
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    _, (report,) = read_all(consumer, topic, _OWED_ON_THE_REPLICA)
    assert report.committed == 0 and report.new_ranges, report  # the log start stood in for the synced offset


def test_a_synced_offset_is_replayed_from_the_log_start_while_the_store_opens(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """The default start (the store opens after a replay): the primary replays from the log start, not the offset."""
    topic = _failed_over(bootstrap, topic_factory, unique_group)
    config = parallel_config(bootstrap, unique_group, store_url)
    del config["fastrecover.recovery.replay.max.offsets"]
    read_all(Consumer(config), topic, _OWED_ON_THE_REPLICA)


def test_rollback_on_the_replica_moves_a_synced_offset_back_to_the_log_start(
    bootstrap: str, topic_factory: Any, unique_group: str, store_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Back to plain consumers after the failover: the marker's ranges are the source's offsets, not the replica's.

    Moved back to where the marker's range starts in the source's offsets, the offset skipped the replica's
    records of the range that lie below it; moved back to the log start, a plain consumer reads them all.
    """
    topic = _failed_over(bootstrap, topic_factory, unique_group)
    upgrade(store_url)  # the replica's consumers had not run yet: an empty store
    code = main(["rollback", "--group", unique_group, "--store-url", store_url, "--bootstrap-servers", bootstrap])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert group_offsets(bootstrap, unique_group, topic)[0].offset == 0, out
    plain_reads(bootstrap, unique_group, topic, _OWED_ON_THE_REPLICA, "latest")
