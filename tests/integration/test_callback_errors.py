"""An application callback that raises inside poll()/consume() costs no record, and close() still ends.

confluent_kafka destroys the records a ``poll()``/``consume()`` had taken from librdkafka when a
callback it runs there raises (``on_commit``, ``stats_cb``, a rebalance callback): an application
that logs the error and reads on never gets them, and its next commits pass over them.  With the
mode on, the error is held and raised by the next call, after the records were returned
(fastrecover/held.py).  Before that, such an error thrown inside librdkafka's close() also left
close() waiting (over 45 s, until killed).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from confluent_kafka import Message

from fastrecover import Consumer
from fastrecover_tools.testing.broker import produce
from tests.integration.dropin import make_lag
from tests.integration.helpers import offset_of, parallel_config

RECORDS = 20_000
FRESH = 2_000
DEADLINE_S = 60.0
#: far above a close() of a consumer with nothing in flight; a close() that does not return is what fails
CLOSE_BOUND_S = 30.0


class Boom(RuntimeError):
    """What the application's callback raises."""


def _raising(kind: str, calls: list[str]) -> dict[str, Any]:
    """Consumer settings with an application callback of ``kind`` that raises (a rebalance one: the first time only)."""

    def boom(*_args: Any) -> None:
        calls.append(kind)
        if kind != "on_assign" or calls.count(kind) == 1:
            raise Boom(f"the application's {kind} fails")

    if kind == "on_commit":  # librdkafka's auto-commit runs it inside the calls, every 50 ms while records flow
        return {"on_commit": boom, "enable.auto.commit": True, "auto.commit.interval.ms": 50}
    if kind == "stats_cb":
        return {"stats_cb": boom, "statistics.interval.ms": 50}
    return {"subscribe_on_assign": boom}


def _close(consumer: Consumer, errors: list[Boom]) -> None:
    try:
        consumer.close()
    except Boom as exc:  # a callback that ran inside close(): raised once closed, as plain's close() does
        errors.append(exc)


def _read(consumer: Consumer, call: str) -> list[Message]:
    if call == "consume":
        return consumer.consume(200, 0.2)
    msg = consumer.poll(0.2)
    return [] if msg is None else [msg]


@pytest.mark.parametrize("call", ["poll", "consume"])
@pytest.mark.parametrize("kind", ["on_commit", "stats_cb", "on_assign"])
@pytest.mark.parametrize("backfill", [False, True], ids=["replay", "backfill"])
def test_a_callback_that_raises_costs_no_record(
    kind: str, call: str, backfill: bool, bootstrap: str, topic_factory: Any, unique_group: str, store_url: str
) -> None:
    """Every record is delivered, each error reaches the application, and close() returns.

    The group's offset is at 0 with 20,000 records after it.  ``replay``: the primary reads them
    alone.  ``backfill``: the recovery jumps to the log end and the child reads them while the
    primary serves fresh records, so the errors come in the merge of both streams as well.
    """
    topic = topic_factory(partitions=1)
    make_lag(bootstrap, topic, unique_group, committed=0, log_end=RECORDS)
    calls: list[str] = []
    extra = _raising(kind, calls)
    on_assign = extra.pop("subscribe_on_assign", None)
    replay_max = 0 if backfill else RECORDS
    config = parallel_config(
        bootstrap,
        unique_group,
        store_url,
        **{"queued.min.messages": 500, "fastrecover.recovery.replay.max.offsets": replay_max, **extra},
    )
    consumer = Consumer(config)
    got: set[int] = set()
    errors: list[Boom] = []
    fresh_sent = False
    wanted = RECORDS + (FRESH if backfill else 0)
    deadline = time.monotonic() + DEADLINE_S
    try:
        consumer.subscribe([topic], **({"on_assign": on_assign} if on_assign else {}))
        # read on past each error, as an application that logs it does, until every record came and an error was seen
        while (len(got) < wanted or not errors) and time.monotonic() < deadline:
            try:
                got.update(offset_of(m) for m in _read(consumer, call) if m.error() is None)
            except Boom as exc:
                errors.append(exc)
            if backfill and not fresh_sent and consumer.recoveries:  # the jump is made: fresh records after it
                produce(bootstrap, topic, [b"fresh"] * FRESH, partition=0)
                fresh_sent = True
    finally:
        # this thread no longer calls the consumer: close() goes to one that can be left behind if it hangs
        closer = threading.Thread(target=_close, args=(consumer, errors), name="close", daemon=True)
        closer.start()
        closer.join(CLOSE_BOUND_S)  # a close() that never returns fails the test instead of hanging the suite
    missing = sorted(set(range(wanted)) - got)
    assert not missing, (
        f"{len(missing)} records never delivered (offsets {missing[:5]}...{missing[-5:]}); the {kind} callback "
        f"ran {calls.count(kind)} times and {len(errors)} errors reached the application"
    )
    assert errors, f"the {kind} callback ran {calls.count(kind)} times, and no error reached the application"
    if kind == "on_assign":
        assert len(errors) == 1, f"on_assign raised once, the application saw {len(errors)} errors"
    assert not closer.is_alive(), f"close() has not returned after {CLOSE_BOUND_S:.0f} s"
