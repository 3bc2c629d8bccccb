"""A partition that leaves the member leaves nothing behind: a long-lived consumer does not grow.

Many assign and revoke cycles over many partitions, each with a range and a commit that routes to
it (with metadata), then every partition revoked: no container of the consumer's state may still
hold a partition.  The walk finds the containers by what they hold, so a new per-partition map is
covered without being named here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import TopicPartition

from fastrecover import Consumer
from fastrecover.tokens import TopicPartitionKey
from fastrecover_tools.testing.broker import produce
from tests.fixtures.broker import TopicFactory
from tests.integration.helpers import mode_of, parallel_config

pytestmark = pytest.mark.integration

PARTITIONS = 25
RECORDS = 20
#: assign-and-revoke cycles of every partition: 400 x 25 = 10,000 partition assignments (about 4 min on
#: 2 cores); FASTRECOVER_STATE_CYCLES sets fewer for a quick look
CYCLES = int(os.environ.get("FASTRECOVER_STATE_CYCLES", "400"))


def _holds_a_partition(item: object) -> bool:
    if isinstance(item, TopicPartitionKey | TopicPartition):
        return True
    return isinstance(item, tuple) and len(item) >= 2 and isinstance(item[0], str) and isinstance(item[1], int)


def _fields(obj: object) -> list[tuple[str, object]]:
    """An object's attributes: its ``__dict__`` and its ``__slots__`` (a partition's state has slots)."""
    fields = list(vars(obj).items()) if hasattr(obj, "__dict__") else []
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                fields.append((name, getattr(obj, name)))
    return fields


def _containers(root: object) -> Iterator[tuple[str, Any]]:
    """Every dict, set, list and tuple attribute of fastrecover's objects reachable from ``root``."""
    seen: set[int] = set()
    todo: list[tuple[str, object]] = [("_fr", root)]
    while todo:
        path, obj = todo.pop()
        if id(obj) in seen or not type(obj).__module__.startswith("fastrecover"):
            continue
        seen.add(id(obj))
        for name, value in _fields(obj):
            where = f"{path}.{name}"
            if isinstance(value, dict | set | frozenset | list | tuple):
                yield where, value
                todo.extend((f"{where}[]", v) for v in (value.values() if isinstance(value, dict) else value))
            else:
                todo.append((where, value))


def partition_state(consumer: Consumer) -> dict[str, int]:
    """Containers of the consumer's state that still hold a partition, with their sizes."""
    out: dict[str, int] = {}
    for where, value in _containers(mode_of(consumer)):
        items = value.keys() if isinstance(value, dict) else value
        if any(_holds_a_partition(i) for i in items):
            out[where] = len(value)
    return out


def test_a_revoked_partition_leaves_nothing_behind_after_many_cycles(
    bootstrap: str, topic_factory: TopicFactory, unique_group: str, tmp_path: Any
) -> None:
    topic = topic_factory(partitions=PARTITIONS)
    for p in range(PARTITIONS):
        produce(bootstrap, topic, [f"r{i}" for i in range(RECORDS)], partition=p)
    store_url = f"sqlite:///{tmp_path / 'ranges.db'}"
    consumer = Consumer(parallel_config(bootstrap, unique_group, store_url))
    try:
        # every partition gets a committed offset below its lag: its first assignment opens a range
        consumer.commit(offsets=[TopicPartition(topic, p, 0) for p in range(PARTITIONS)], asynchronous=False)
        before = partition_state(consumer)
        assert before == {}, before
        for cycle in range(CYCLES):
            consumer.assign([TopicPartition(topic, p) for p in range(PARTITIONS)])
            # a commit inside each range, with metadata: the application's metadata is kept for its commit
            consumer.commit(
                offsets=[TopicPartition(topic, p, 1, metadata=f"m{cycle}") for p in range(PARTITIONS)],
                asynchronous=True,
            )
            consumer.poll(0)
            if cycle == 0:
                held = partition_state(consumer)
                states = [n for where, n in held.items() if where.endswith("partitions._states")]
                assert states == [PARTITIONS], f"the walk sees the assigned state: {held}"
            consumer.unassign()
            consumer.poll(0)
        assert consumer.recoveries, "the cycles recovered partitions with ranges"
        assert partition_state(consumer) == {}, "revoked partitions left state behind"
    finally:
        consumer.close()
