"""The optional C steady paths of ``Consumer.poll()``, ``commit()`` and ``store_offsets()``
(``fastrecover/_fastpoll.c``), and their switch.

poll() runs once per record; in Python even a bare forwarding method costs more than issue 9's
budget over confluent_kafka's own poll().  The extension repeats the Python steady path,
:func:`fastrecover.steady.poll` (``Consumer.poll``), branch for branch and leaves every other case to it, so
the Python code stays the reference: set ``FASTRECOVER_PURE_PYTHON=1`` (read at import) to run it
alone, or run where the extension was not built.  The same holds of the first test of
``Consumer.commit`` and ``Consumer.store_offsets``, which applications often call once per record too.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger("fastrecover.accel")

_F = TypeVar("_F", bound=Callable[..., Any])

#: the environment variable that turns the C path off (any value but "", "0", "false", "no")
PURE_PYTHON_ENV = "FASTRECOVER_PURE_PYTHON"

#: the interface this Python code expects of the extension; ``_fastpoll.c`` compiles the same number in
#: (``FASTPOLL_ABI``, exported as ``ABI``).  Both change together, with every change of the C module's
#: types or of the steady path it repeats, so that a module built from an older source is refused.
ABI = 2


def checked(module: Any) -> Any:
    """``module`` when it was built from the source this code expects, else None (and a warning why).

    An editable install keeps the built module beside the source: a checkout that changed
    ``_fastpoll.c`` without a rebuild would otherwise run a C path that no longer matches the Python one.
    """
    built = getattr(module, "ABI", None)
    if built == ABI:
        return module
    log.warning(
        "%s was built from another fastrecover/_fastpoll.c (interface %s, this fastrecover needs %d): "
        "Consumer.poll() runs in Python, slower, until the extension is rebuilt "
        "(`make venv`, or reinstall fastrecover)",
        getattr(module, "__file__", "fastrecover._fastpoll"),
        "unnumbered" if built is None else built,
        ABI,
    )
    return None


_fastpoll: Any = None
if os.environ.get(PURE_PYTHON_ENV, "").strip().lower() in ("", "0", "false", "no"):
    try:
        import fastrecover._fastpoll as _fastpoll  # the one module that loads the extension
    except ModuleNotFoundError as exc:  # a source checkout or a platform without a compiler: the Python path
        log.debug("fastrecover._fastpoll not available (%s): Consumer.poll() runs in Python", exc)
    except ImportError as exc:  # built, but it does not load (another interpreter's build, a missing symbol)
        log.warning(
            "fastrecover._fastpoll does not load (%s): Consumer.poll() runs in Python, slower, until the "
            "extension is rebuilt (`make venv`, or reinstall fastrecover)",
            exc,
        )
    else:
        _fastpoll = checked(_fastpoll)

#: True when Consumer.poll()'s steady path runs in C
ENABLED: bool = _fastpoll is not None

#: the base of SteadyGate (fastrecover/steady.py): the fast path's counters as C fields when the extension is there
StateBase: type = _fastpoll.FastState if ENABLED else object


def fast_poll(kafka_poll: Callable[..., Any], py_poll: Callable[..., Any], slice_s: float, run: int) -> Any:
    """``py_poll`` with its steady path in C when the extension is there, else ``py_poll`` itself.

    The result binds like a function and carries ``py_poll``'s name, docstring and signature
    (``__wrapped__``), so ``help()``, ``inspect.signature`` and ``super().poll`` see one method.
    """
    if not ENABLED:
        return py_poll
    fast = _fastpoll.FastPoll(kafka_poll, py_poll, float(slice_s), run)
    return functools.update_wrapper(fast, py_poll)


def fast_offsets(kafka_method: Callable[..., Any], kind: str) -> Callable[[_F], _F]:
    """A decorator: ``py_method`` (``Consumer.commit`` or ``.store_offsets``) with its steady one-record call in C.

    While nothing of the mode's is on any partition, the Python method hands a one-record call to
    ``kafka_method`` (confluent_kafka's own); the C type makes the same test and the same call without
    the Python frame and its keyword matching, and gives every other call to ``py_method``.  With
    ``store_offsets(message=m)`` per record and ``consume(500)``, the caller's thread ran 9,079
    instructions per record against 9,448 for the Python method (plain: 8,194; callgrind, 3 repeats).
    What is left is mostly the attribute reads on the consumer and the mode.
    """

    def decorate(py_method: _F) -> _F:
        if not ENABLED:
            return py_method
        fast = _fastpoll.FastOffsets(kafka_method, py_method, kind)
        return functools.update_wrapper(fast, py_method)  # type: ignore[return-value]

    return decorate
