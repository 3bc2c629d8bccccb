"""What a mode-on consumer does at construction, and what it leaves until it is needed.

A restarted consumer's first fresh record waits for the process to start, the group join and the
recovery.  The join is mostly waiting on the broker (about 25 ms on a local broker with the
quickstart's settings), while the mode's own modules (the recovery, the child, the store link, the
commit router, their value types) take about 12 ms of CPU to import.  Imported with
``fastrecover.consumer`` they came before the join on that path, and made a small-lag restart slower
than the plain client's.  So construction does only what must fail early (the configuration check,
the primary's librdkafka handle, the child's when its overrides could be refused, the advice on
static membership), and ``subscribe()`` hands the subscription to librdkafka first and imports the
mode after: librdkafka's own thread sends the join and waits for the broker while the caller's
thread imports.  Not a thread of its own, from construction on: it would take the GIL from the
application's thread at the next forced switch, and the join would leave about 5 ms later.  The
first call that needs the mode builds it in the caller's thread, which owns both consumers.

Until then the object is an instance of :func:`pending_class` of ``Consumer``: every method that
depends on the mode first builds it, then runs as the built consumer's.  The methods called once per
record (:data:`BUILDS_ITSELF`) build it themselves and stay ``Consumer``'s own, so that one an
application bound before its first poll costs nothing more for the consumer's life.  The mode is built at
construction instead for a subclass of ``Consumer`` (its class is the application's to keep), and
when every recovery waits for the store (``Settings.defers_store_open`` false): its open, about
0.15 s, then begins at once, and the import no longer matters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import TopicPartition
from confluent_kafka.cimpl import Consumer as _KafkaConsumer

from fastrecover.config import Settings
from fastrecover.errors import ConfigError
from fastrecover.held import HeldError

if TYPE_CHECKING:
    from fastrecover.parallel import ParallelMode

log = logging.getLogger("fastrecover.consumer")

_K = _KafkaConsumer
C = TypeVar("C", bound=_KafkaConsumer)


def child_handle(conf: dict[str, Any], settings: Settings) -> _KafkaConsumer | None:
    """The child's librdkafka handle, made at construction when ``fastrecover.child.*`` overrides are set.

    The child is made of the application's settings, which librdkafka checks when it makes the
    primary's handle, fastrecover's own (their values bounded by fastrecover's configuration check)
    and the ``fastrecover.child.*`` overrides.  Only the overrides can make librdkafka refuse the
    child and not the primary, so with overrides the handle is made here: a refused one fails at
    construction, and the error names the setting librdkafka names.  Without them the handle is
    made when the child first needs it (a range to read, or a jump asking the cluster's id when the
    primary's client cannot give it: fastrecover/recovery_reads.py).
    Made at construction, a second client started connecting and looking up its group's coordinator
    while the primary joined: CPU of this process and the broker's, on the way to the first fresh
    record of every restart, for a handle that a restart with a small lag never uses.
    """
    if not settings.child_overrides:
        return None
    from fastrecover.child_config import child_config  # the mode's import brings it otherwise: not on every start

    derived = child_config(conf, settings)  # an override the child's correctness rests on: ConfigError
    try:
        return _KafkaConsumer(derived)
    except Exception as exc:
        raise ConfigError(
            f"the child consumer's configuration (the application's settings, fastrecover.backfill.* and "
            f"fastrecover.child.* overrides) is refused: {exc}"
        ) from exc


def advise_static_membership(conf: dict[str, Any]) -> None:
    """Say once, at construction, why a crash will cost a session timeout, and what to set instead.

    Fast recovery starts when the restarted process gets its partitions back. A dynamic member of
    a classic group gets them only once the dead member's session expires; a static one at once.
    """
    if conf.get("group.instance.id") or str(conf.get("group.protocol", "classic")).lower() != "classic":
        return
    log.warning(
        "group.instance.id is not set: after a crash, the restarted process gets its partitions back only "
        "when the dead member's session expires (session.timeout.ms=%s ms) and fresh records wait that long; "
        "give every member a stable group.instance.id (a host name, a StatefulSet ordinal) so that a restart "
        "takes its partitions back at once",
        conf.get("session.timeout.ms", 45000),
    )


class PendingMode:
    """What the mode is built from, kept until the first call that needs the mode."""

    __slots__ = ("child", "conf", "held", "settings")

    def __init__(self, conf: dict[str, Any], settings: Settings, child: _KafkaConsumer | None, held: HeldError) -> None:
        self.conf = conf
        self.settings = settings
        self.child = child
        self.held = held

    def build(self, app: _KafkaConsumer) -> ParallelMode:
        """The mode of ``app``, its modules imported now if they are not yet."""
        return mode_class()(app, self)


def mode_class() -> type[ParallelMode]:
    from fastrecover.parallel import ParallelMode

    return ParallelMode


#: the methods an application calls once per record build the mode themselves (when ``_fr`` is None
#: and a mode is pending), and the pending class leaves them as they are: one bound while the mode
#: was pending (``commit = consumer.commit`` ahead of the read loop) is then the consumer's own, with
#: no wrapper in front of every call for the consumer's whole life.
BUILDS_ITSELF = frozenset({"poll", "consume", "commit", "store_offsets"})


def built_mode(consumer: Any) -> ParallelMode | None:
    """The mode of a consumer that has none: built now if one is pending, else None (mode off, or closed).

    The methods of :data:`BUILDS_ITSELF` call it as ``self._fr or built_mode(self)``: a built mode is
    always true (ParallelMode has no ``__len__``), so the steady path pays one truth test.
    """
    return consumer._build_mode() if consumer._pending is not None else None  # type: ignore[no-any-return]


def _building(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    # ``method`` is called, not looked up on the instance: a method bound while pending stays this
    # wrapper once the mode is built, and must not build it again.
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._pending is not None:
            self._build_mode()
        return method(self, *args, **kwargs)

    call.__name__ = name
    call.__qualname__ = f"pending.{name}"
    call.__doc__ = method.__doc__
    return call


def _building_property(name: str, prop: property) -> property:
    def get(self: Any) -> Any:
        self._build_mode()
        return getattr(self, name)

    return property(get, doc=prop.__doc__)


def _relay(event: str) -> Callable[[Any, list[TopicPartition]], None]:
    """A rebalance callback that reaches the built mode's hand-over (callbacks run only once it is built)."""

    def call(consumer: Any, partitions: list[TopicPartition]) -> None:
        getattr(consumer._fr.handover, event)(consumer, partitions)

    call.__name__ = event
    return call


_RELAYS = {event: _relay(event) for event in ("on_assign", "on_revoke", "on_lost")}


def pending_class(consumer: type[C]) -> type[C]:
    """``consumer`` as it is until its mode is built: each public method builds the mode first.

    ``consumer`` provides ``_build_mode()``, which builds the mode and makes the object an
    instance of ``consumer`` itself.  ``subscribe()`` first hands the subscription to librdkafka (with
    callbacks that reach the mode once built), so that the group join runs while the import finishes.
    """
    members: dict[str, Any] = {"__doc__": consumer.__doc__, "__module__": consumer.__module__}
    for name, attr in vars(consumer).items():
        if name.startswith("_") or name in BUILDS_ITSELF:  # __enter__/__exit__ reach the public methods
            continue
        if isinstance(attr, property):
            members[name] = _building_property(name, attr)
        elif callable(attr):
            members[name] = _building(name, attr)

    def subscribe(
        self: Any, topics: list[str], on_assign: Any = None, on_revoke: Any = None, on_lost: Any = None
    ) -> None:
        callbacks = (on_assign, on_revoke, on_lost)
        if self._pending is None:  # bound while pending, called once built
            consumer.subscribe(self, topics, *callbacks)
            return
        if any(cb is not None and not callable(cb) for cb in callbacks):
            self._build_mode()  # confluent_kafka's own error, from the built consumer's subscribe()
            self.subscribe(topics, *callbacks)
            return
        _K.subscribe(self, topics, **_RELAYS)  # librdkafka's thread joins the group while the mode is imported
        self._build_mode().handover.subscribed(*callbacks)

    subscribe.__doc__ = consumer.subscribe.__doc__
    members["subscribe"] = subscribe

    def close(self: Any) -> None:
        if self._pending is None:  # bound while pending, called once built
            consumer.close(self)
            return
        try:
            self._build_mode()
        except BaseException:
            # nothing of the mode runs yet: the two handles are all there is to close
            if self._pending.child is not None:
                self._pending.child.close()
            _K.close(self)
            raise
        self.close()

    close.__doc__ = consumer.close.__doc__
    members["close"] = close
    return type(f"_Pending{consumer.__name__}", (consumer,), members)
