"""Types of the C extension fastrecover/_fastpoll.c (see fastrecover/_accel.py)."""

from collections.abc import Callable
from typing import Any

#: the interface number compiled in (FASTPOLL_ABI); fastrecover/_accel.py refuses a module whose number is not its ABI
ABI: int

class FastState:
    fast_calls: int
    fast_timeout: Any
    fast_wait: Any
    primary_messages: int
    next_tick: float
    joining_until: float

class FastPoll:
    slow: Callable[..., Any]
    direct: bool
    def __init__(self, kafka_poll: Callable[..., Any], slow: Callable[..., Any], slice: float, run: int) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def __get__(self, obj: object, objtype: type | None = None) -> Any: ...
