"""An application callback's exception, held until the records of the call it ran in are safe.

confluent_kafka runs the application's callbacks (``on_assign``, ``on_revoke``, ``on_lost``,
``on_commit``, ``error_cb``, ``stats_cb``, ``throttle_cb``) inside ``poll()`` and ``consume()``.
When one raises, it destroys the records that call had already taken from librdkafka and raises
instead: one record from ``poll()``, a whole batch from ``consume()``.  librdkafka's position is
past them by then, so an application that logs the error and reads on never sees them, and the
next records it settles move the committed offset over them: records lost.

With the mode on, what such a callback raises is held here instead: the call returns its records,
and the next ``poll()`` or ``consume()`` raises the exception before it takes anything (the same
call does, when it has not returned yet).  Only ``Exception`` is held: ``KeyboardInterrupt`` and
``SystemExit`` end the process, whose unsettled records are read again by the next one, and they
must not wait for another call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

#: the application's callbacks librdkafka runs inside the primary's poll() and consume()
CONFIG_CALLBACKS = ("on_commit", "error_cb", "stats_cb", "throttle_cb")


class HeldError:
    """The first exception an application callback raised since the last ``poll()``/``consume()`` raised one."""

    __slots__ = ("error", "gate")

    def __init__(self) -> None:
        self.error: Exception | None = None
        #: the consumer's steady gate once its mode is built: a held error ends the poll() run in C
        self.gate: Any = None

    def ends_runs_of(self, gate: Any) -> None:
        """From now on a held error ends ``gate``'s steady run (the mode's gate, once the mode is built)."""
        self.gate = gate

    def hold(self, error: Exception) -> None:
        """Keep ``error`` for the next call; a later one is dropped, as confluent_kafka keeps the first."""
        if self.error is None:
            self.error = error
        if self.gate is not None:
            self.gate.end_run()  # the next poll() takes the Python path, which raises it

    def raise_held(self) -> None:
        """Raise the held exception, once."""
        error, self.error = self.error, None
        if error is not None:
            raise error

    def guarded(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        """``callback`` with what it raises held rather than thrown into confluent_kafka."""

        def call(*args: Any) -> Any:
            try:
                return callback(*args)
            except Exception as exc:
                self.hold(exc)
                return None

        call.__name__ = getattr(callback, "__name__", "callback")
        call.__doc__ = getattr(callback, "__doc__", None)
        return call


def held_callbacks(conf: dict[str, Any]) -> tuple[dict[str, Any], HeldError]:
    """The primary's configuration with the application's callbacks guarded, and where they hold errors."""
    held = HeldError()
    guarded = dict(conf)
    for key in CONFIG_CALLBACKS:
        callback = conf.get(key)
        if callable(callback):
            guarded[key] = held.guarded(callback)
    return guarded, held
