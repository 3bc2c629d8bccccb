"""The parity harness of issue 10: the same calls against plain, mode off and mode on.

A *flavour* names the consumer under test:

- ``plain``: ``confluent_kafka.Consumer`` itself, the reference;
- ``off``: ``fastrecover.Consumer`` with the mode off (must be exactly plain);
- ``on``: ``fastrecover.Consumer`` with ``enable.parallel.rebalance`` and a SQLite store file.

:func:`outcome` runs one call and reduces what came back to a comparable value: the
return value (normalised: TopicPartitions to tuples, Messages to (partition, offset)) or
the exception's exact type and message.  A call that does not return within its deadline
is reported as a hang rather than blocking the suite (the call keeps running on a daemon
thread; the test fails on the mismatch).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import Message, TopicPartition

import fastrecover
from fastrecover_tools.testing.broker import produce

FLAVOURS = ("plain", "off", "on")
OURS = ("off", "on")


def flavour_config(flavour: str, base: dict[str, Any], tmp_path: Path, **extra: Any) -> dict[str, Any]:
    """``base`` plus what the flavour needs (mode-on keys only for ``on``)."""
    conf = dict(base)
    if flavour == "on":
        conf.update(
            {
                "enable.parallel.rebalance": True,
                "fastrecover.store.url": f"sqlite:///{tmp_path / 'ranges.db'}",
                "fastrecover.backfill.min.offsets": 10,
                "fastrecover.recovery.replay.max.offsets": 0,  # ranges at the first recovery, open store or not
            }
        )
    conf.update(extra)
    return conf


def consumer_class(flavour: str) -> type[Any]:
    return confluent_kafka.Consumer if flavour == "plain" else fastrecover.Consumer


def make(flavour: str, base: dict[str, Any], tmp_path: Path, **extra: Any) -> Any:
    return consumer_class(flavour)(flavour_config(flavour, base, tmp_path, **extra))


def normalise(value: Any) -> Any:
    """A value two consumers can be compared on (records by position, partitions by fields)."""
    if isinstance(value, TopicPartition):
        return ("TP", value.topic, value.partition, value.offset, value.metadata, value.error)
    if isinstance(value, Message):
        return ("MSG", value.topic(), value.partition(), value.offset(), value.error())
    if isinstance(value, list | tuple):
        return [normalise(v) for v in value]
    return value


@dataclass(frozen=True)
class Outcome:
    """What one call did: ``("return", value)``, ``("raise", type, message)`` or ``("hang",)``."""

    kind: str
    value: Any = None
    exc_type: type[BaseException] | None = None
    message: str = ""

    def __str__(self) -> str:
        if self.kind == "raise":
            assert self.exc_type is not None
            return f"raises {self.exc_type.__module__}.{self.exc_type.__qualname__}({self.message!r})"
        if self.kind == "hang":
            return "did not return"
        return f"returns {self.value!r}"


def outcome(call: Callable[[], Any], deadline_s: float = 10.0) -> Outcome:
    """Run ``call`` on a daemon thread; what it returned or raised, or that it hung."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:
            box["exc"] = exc

    thread = threading.Thread(target=run, daemon=True, name="parity-call")
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        return Outcome("hang")
    if "exc" in box:
        exc = box["exc"]
        return Outcome("raise", exc_type=type(exc), message=str(exc))
    return Outcome("return", value=normalise(box.get("value")))


def kafka_code(exc: BaseException) -> Any:
    """The KafkaError code of a KafkaException (None for anything else)."""
    if isinstance(exc, confluent_kafka.KafkaException) and exc.args:
        err = exc.args[0]
        return err.code() if isinstance(err, confluent_kafka.KafkaError) else None
    return None


def make_lag(bootstrap: str, topic: str, group: str, *, committed: int, log_end: int, partitions: int = 1) -> None:
    """The state a crash leaves: ``log_end`` records per partition, the group's offset at ``committed``.

    The offset is committed by a plain consumer that never joins the group (what a member that
    committed and was then SIGKILLed leaves behind; tests that need the kill itself use
    :func:`tests.integration.helpers.lag_after_crash`).
    """
    for p in range(partitions):
        produce(bootstrap, topic, [f"p{p}-r{i}" for i in range(log_end)], partition=p)
    commit_offsets(bootstrap, group, [TopicPartition(topic, p, committed) for p in range(partitions)])


def commit_offsets(bootstrap: str, group: str, offsets: list[TopicPartition]) -> None:
    """Commit ``offsets`` for ``group`` from a consumer that never joins it."""
    probe = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        probe.commit(offsets=offsets, asynchronous=False)
    finally:
        probe.close()


def base_config(bootstrap: str, group: str, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "session.timeout.ms": 6000,
        "heartbeat.interval.ms": 500,
    }
    conf.update(extra)
    return conf
