"""A mode-on consumer's construction leaves the mode's import to its first call that needs the mode.

No broker: librdkafka connects lazily, so a consumer pointed at a closed port constructs, builds its
mode and closes without one.  What the pending state must guarantee:

* importing ``fastrecover.consumer``, or constructing a consumer, does not import the mode's units;
* until the first call that needs the mode the object is a pending subclass, and every public
  method of ``Consumer`` builds the mode first, then answers as ``Consumer``'s;
* the mode is built at construction where the overlap cannot apply (an application's subclass)
  or does not pay (every recovery waits for the store).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fastrecover.consumer import Consumer
from fastrecover.startup import BUILDS_ITSELF

#: a port nothing listens on: construction and close need no broker
NOWHERE = "127.0.0.1:9"


@pytest.fixture
def conf(tmp_path: Path) -> dict[str, Any]:
    return {
        "bootstrap.servers": NOWHERE,
        "group.id": "startup-test",
        "group.instance.id": "startup-test-1",
        "enable.parallel.rebalance": True,
        "fastrecover.store.url": f"sqlite:///{tmp_path / 'store.db'}",
    }


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    made: list[Consumer] = []
    yield made
    for consumer in made:
        consumer.close()


def _loaded_after(imports: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``imports``."""
    code = f"import sys; {imports}; print(','.join(m for m in {modules!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return [m for m in done.stdout.strip().split(",") if m]


def test_importing_the_consumer_leaves_the_mode_unimported() -> None:
    units = ("fastrecover.parallel", "fastrecover.mode_state", "fastrecover.recoverer", "fastrecover.child")
    assert _loaded_after("import fastrecover.consumer", (*units, "fastrecover.store_link", "fastrecover.book")) == []


def test_the_mode_import_leaves_out_what_only_some_consumers_need() -> None:
    """The mode is imported while the group join waits (startup.py): hashlib (OpenSSL) is for signed
    mirrors, json for mirrors with ranges, dataclasses (whose classes compile their methods) for the
    metrics snapshots, SQLAlchemy for the store (it opens after the first recovery)."""
    heavy = ("hashlib", "hmac", "json", "dataclasses", "zstandard", "sqlalchemy")
    assert _loaded_after("import fastrecover.consumer; import fastrecover.parallel", heavy) == []


def test_a_mode_on_consumer_is_pending_until_a_call_needs_the_mode(
    conf: dict[str, Any], consumers: list[Consumer]
) -> None:
    consumer = Consumer(conf)
    consumers.append(consumer)
    assert isinstance(consumer, Consumer) and type(consumer) is not Consumer
    assert consumer._fr is None
    assert consumer.parallel_rebalance_enabled, "the first call builds the mode and answers"
    assert type(consumer) is Consumer and consumer._fr is not None and consumer._gate is consumer._fr.gate


def _calls() -> dict[str, Callable[[Consumer], object]]:
    """One call of each public method and property of Consumer that needs no broker."""
    return {
        "child_consumer_is_alive": lambda c: c.child_consumer_is_alive(),
        "parallel_rebalance_enabled": lambda c: c.parallel_rebalance_enabled,
        "backfill_progress": lambda c: c.backfill_progress(),
        "recoveries": lambda c: c.recoveries,
        "children_started": lambda c: c.children_started,
        "child_restarts": lambda c: c.child_restarts,
        "metrics": lambda c: c.metrics(),
        "poll": lambda c: c.poll(0),
        "consume": lambda c: c.consume(1, 0),
        "pause": lambda c: c.pause([]),
        "resume": lambda c: c.resume([]),
        "assign": lambda c: c.assign([]),
        "incremental_assign": lambda c: c.incremental_assign([]),
        "unassign": lambda c: c.unassign(),
        "incremental_unassign": lambda c: c.incremental_unassign([]),
        "set_sasl_credentials": lambda c: c.set_sasl_credentials("u", "p"),
    }


def test_the_calls_cover_every_public_member_but_those_that_need_a_broker() -> None:
    public = {name for name in vars(Consumer) if not name.startswith("_")}
    needs_a_broker = {"commit", "store_offsets", "committed", "subscribe", "seek", "close"}
    assert public == set(_calls()) | needs_a_broker


@pytest.mark.parametrize("name", sorted(_calls()))
def test_each_public_member_builds_the_mode_first(name: str, conf: dict[str, Any], consumers: list[Consumer]) -> None:
    consumer = Consumer(conf)
    consumers.append(consumer)
    assert consumer._fr is None
    _calls()[name](consumer)
    assert type(consumer) is Consumer and consumer._fr is not None


def test_methods_bound_while_pending_answer_as_the_built_consumer(conf: dict[str, Any]) -> None:
    """``commit = consumer.commit`` before the first poll is how a tuned loop starts: the bound method is
    the pending class's for the consumer's whole life, and must not try to build the mode again."""
    consumer = Consumer(conf)
    bound = {name: getattr(consumer, name) for name in ("poll", "consume", "pause", "metrics", "subscribe", "close")}
    assert consumer._fr is None
    for name in BUILDS_ITSELF:  # no wrapper in front of a per-record call, for the consumer's whole life
        assert getattr(type(consumer), name) is getattr(Consumer, name), name
    assert consumer.parallel_rebalance_enabled, "built by another call"
    assert consumer._fr, "the per-record methods read `self._fr or built_mode(self)`: a built mode is true"
    assert bound["poll"](0) is None
    assert bound["consume"](1, 0) == []
    bound["pause"]([])
    assert bound["metrics"]().parallel_rebalance
    bound["subscribe"](["startup-topic"])
    bound["close"]()
    assert consumer._fr is None
    with pytest.raises(RuntimeError, match="Consumer closed"):
        bound["poll"](0)


def test_close_of_a_pending_consumer_builds_and_closes_the_mode(conf: dict[str, Any]) -> None:
    consumer = Consumer(conf)
    consumer.close()
    assert type(consumer) is Consumer and consumer._fr is None
    with pytest.raises(RuntimeError, match="Consumer closed"):
        consumer.poll(0)


def test_a_subclass_is_built_at_construction_and_keeps_its_class(
    conf: dict[str, Any], consumers: list[Consumer]
) -> None:
    class Application(Consumer):  # type: ignore[misc]
        pass

    consumer = Application(conf)
    consumers.append(consumer)
    assert type(consumer) is Application and consumer._fr is not None


def test_a_store_every_recovery_waits_for_is_built_at_construction(
    conf: dict[str, Any], consumers: list[Consumer]
) -> None:
    consumer = Consumer({**conf, "fastrecover.recovery.replay.max.offsets": 0})
    consumers.append(consumer)
    assert type(consumer) is Consumer and consumer._fr is not None


def test_the_mode_off_is_confluent_kafkas_own_from_the_start(conf: dict[str, Any]) -> None:
    consumer = Consumer({**conf, "enable.parallel.rebalance": False})
    try:
        assert consumer._fr is None and not consumer.parallel_rebalance_enabled
        assert type(consumer).poll is not Consumer.poll, "confluent_kafka's own methods"
    finally:
        consumer.close()


def test_the_mode_built_later_is_immune_to_a_replaced_confluent_kafka_consumer(tmp_path: Path) -> None:
    """The mode's modules are imported after construction, maybe after an application or a test harness
    replaced ``confluent_kafka.Consumer`` (confluent's own tests/test_Consumer.py run against us does):
    they bind librdkafka's class from ``confluent_kafka.cimpl``, never the package's name."""
    code = f"""
import confluent_kafka
from fastrecover import Consumer

class Replaced(Consumer):
    pass

confluent_kafka.Consumer = Replaced
consumer = Consumer({{"bootstrap.servers": "{NOWHERE}", "group.id": "g", "group.instance.id": "i",
                     "enable.parallel.rebalance": True,
                     "fastrecover.store.url": "sqlite:///{tmp_path / "store.db"}"}})
consumer.subscribe(["t"])
assert consumer.poll(0) is None
consumer.close()
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_construction_leaves_the_mode_unimported_until_a_call_needs_it(tmp_path: Path) -> None:
    """Construction imports none of the mode's units: ``subscribe()`` imports them once the join is
    handed to librdkafka, so that nothing of theirs comes before the join on a restart's path."""
    code = f"""
import sys
from fastrecover import Consumer

consumer = Consumer({{"bootstrap.servers": "{NOWHERE}", "group.id": "g", "group.instance.id": "i",
                     "enable.parallel.rebalance": True,
                     "fastrecover.store.url": "sqlite:///{tmp_path / "store.db"}"}})
before = "fastrecover.parallel" in sys.modules
consumer.subscribe(["t"])
print(before, "fastrecover.parallel" in sys.modules, type(consumer) is Consumer)
consumer.close()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True", "True"]
