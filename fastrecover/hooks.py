"""Named fault-injection points.

The fault campaign (``fastrecover chaos``) and the tests stall or fail the
library at exact places: inside a store transaction, between the two commit
logs, in the child's batch handling.  The library calls :func:`fire` at those
places; by default nothing is registered and a call costs one dict lookup.
Registering by name keeps the points explicit: renaming a function cannot
silently disable an injection the way patching it by its string name could.
"""

from __future__ import annotations

from collections.abc import Callable

#: Every point the library fires, with where it sits.
POINTS = {
    "token-write": "a range token was inserted, its transaction not yet committed",
    "claim": "a claim holds the token's row lock, before its UPDATE",
    "store-commit": "a progress commit holds the rows' locks, before its UPDATE",
    "between-commits": "range progress is durable in the store, the Kafka commit not yet sent "
    "(while it is armed, a synchronous commit runs the two one after the other instead of together)",
    "child-batch": "the child fetched a batch, before any of it is accepted",
    "store-open": "the consumer's background thread is about to open the store (construction has returned)",
    "mirror-first-commit": "a recovery while the store opens is about to commit the range markers that let it jump",
    "hand-back-read": "a revoke or close hands ranges back, before it reads Kafka's committed offsets "
    "(under auto-commit, after librdkafka's offset store was committed)",
}

_registered: dict[str, Callable[[], None]] = {}


def register(point: str, action: Callable[[], None]) -> None:
    """Run ``action`` whenever the library reaches ``point`` (it may block or raise)."""
    if point not in POINTS:
        raise ValueError(f"unknown fault point {point!r}; known: {', '.join(sorted(POINTS))}")
    _registered[point] = action


def clear() -> None:
    _registered.clear()


def fire(point: str) -> None:
    action = _registered.get(point)
    if action is not None:
        action()


def armed(point: str) -> bool:
    """Whether something is registered at ``point`` (a code path may keep the point reachable only then)."""
    return point in _registered
