"""The child consumer's librdkafka configuration, derived from the application's.

The child is a second handle made of the primary's settings, with the keys it must not inherit
dropped and the ones its correctness rests on set by fastrecover (docs/configuration.md).
``fastrecover.child.<key>`` overrides come last, for what an operator may need to tune (fetch sizes,
reconnect back-offs, a ``group.id`` the cluster's ACLs allow).  An override of a key the child's
correctness rests on is refused when the consumer is constructed: each of them, given another
value, lets the child skip records that are still in the log, or deliver records the primary would
not, or write to the application's group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastrecover.config import CHILD_PREFIX, Settings, parse_bool
from fastrecover.errors import ConfigError

#: the child's reconnect.backoff.ms unless the application sets it or its maximum: librdkafka connects a
#: handle with no broker up at most once per half of it (50 ms by default), and the child has none up when
#: it gets its first ranges, or when a recovery asks it for the cluster's id (configuration.md)
CHILD_RECONNECT_BACKOFF_MS = 10


#: librdkafka keys the child must not inherit: it never joins the group and never commits to Kafka.
_CHILD_DROP = (
    "group.instance.id",
    "partition.assignment.strategy",
    "group.protocol",
    "group.remote.assignor",
    "on_commit",
    "enable.auto.commit",
    "enable.auto.offset.store",
    "auto.offset.reset",
    "enable.partition.eof",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "isolation.level",
    "client.id",
    # The application's callbacks serve the primary only: the child's errors and statistics go to
    # fastrecover's logger, so an application callback never runs for a client it did not create.
    "stats_cb",
    "error_cb",
    "throttle_cb",
    "statistics.interval.ms",
)


def child_config(primary: Mapping[str, Any], settings: Settings) -> dict[str, Any]:
    """The child consumer's librdkafka config, derived from the primary's.

    It keeps connection and security settings, uses assign() only, never commits to Kafka (its commit log
    is the store) and turns offset-out-of-range into an error: retention gaps are counted, not reset.
    ConfigError for an override those rest on (:func:`_check_overrides`).
    """
    conf = {k: v for k, v in primary.items() if k not in _CHILD_DROP}
    conf.update(
        {
            "group.id": f"{primary['group.id']}.fastrecover-child",
            "client.id": f"{primary.get('client.id', 'rdkafka')}-fastrecover-child",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
            "fetch.wait.max.ms": 50,
            # unread, the handle's prefetch queue is the back-pressure point: fetching stops when it is full
            "queued.min.messages": settings.queue_max_messages,
            # when that queue is full librdkafka waits this long before fetching again (default 1 s):
            # the backlog is read as fast as the application takes it, so check back soon
            "fetch.queue.backoff.ms": 20,
        }
    )
    if "isolation.level" in primary:
        conf["isolation.level"] = primary["isolation.level"]
    if "reconnect.backoff.ms" not in conf and "reconnect.backoff.max.ms" not in conf:
        conf["reconnect.backoff.ms"] = CHILD_RECONNECT_BACKOFF_MS
    _check_overrides(primary, settings.child_overrides)
    conf.update(settings.child_overrides)
    return conf


#: librdkafka's isolation.level when the application sets none
_DEFAULT_ISOLATION = "read_committed"

#: boolean keys fastrecover sets to false on the child, and why no override may turn them on
_CHILD_FALSE = {
    "enable.auto.commit": "the child's commit log is the range store; librdkafka committing its positions would "
    "write offsets inside the lag it is reading",
    "enable.auto.offset.store": "the child's progress is its delivery cursor, written to the range store; "
    "librdkafka's offset store would hold positions of records not yet handed out",
    "enable.partition.eof": "the application's end-of-partition events come from the primary, held while the child "
    "still reads that partition",
}


def _check_overrides(primary: Mapping[str, Any], overrides: Mapping[str, Any]) -> None:
    """Refuse the overrides that would make the child skip, add or commit records (ConfigError naming the key)."""
    for key, value in overrides.items():
        name = f"{CHILD_PREFIX}{key}"
        if key in _CHILD_FALSE and parse_bool(name, value):
            raise ConfigError(f"{name}={value!r} is refused: {_CHILD_FALSE[key]}; leave it unset")
        if key == "auto.offset.reset" and str(value).lower() != "error":
            raise ConfigError(
                f"{name}={value!r} is refused: the child reads ranges whose start retention may have removed, and "
                "must learn it (auto.offset.reset=error) to read on from the log start with the gap counted on the "
                "range; a reset to another offset would skip records still in the log, or read others twice"
            )
        if key == "isolation.level":
            own = str(primary.get("isolation.level", _DEFAULT_ISOLATION))
            if str(value).lower() != own.lower():  # librdkafka reads the names in any case
                raise ConfigError(
                    f"{name}={value!r} is refused: the child reads the lag the primary would have read, under "
                    f"the primary's isolation.level ({own!r}); with another it would deliver records of aborted "
                    "transactions or leave out records the application asked for"
                )
        if key == "group.id" and str(value) == str(primary.get("group.id")):
            raise ConfigError(
                f"{name}={value!r} is refused: it is the application's group, which the child's handle must never "
                "act for; give another group id (one the cluster's ACLs allow), or leave it unset"
            )
