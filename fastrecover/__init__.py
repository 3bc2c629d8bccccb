"""fastrecover: KIP-333 ``enable.parallel.rebalance`` for confluent-kafka.

``Consumer`` and the error classes are imported on first use (PEP 562): a process
that only needs a submodule (a Spark worker, the store CLI) does not pay for the
consumer's imports, and a restarted consumer's start does not wait for the error
classes before its first record.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastrecover import errors as errors
    from fastrecover.consumer import Consumer
    from fastrecover.errors import (
        CodecError,
        ConfigError,
        CorruptTokenError,
        FastRecoverError,
        FencedError,
        SchemaBehindError,
        StateError,
        StoreError,
        StoreUnavailableError,
    )

__version__ = "0.1.0"


#: the error classes this package exports, imported at their first use like ``Consumer``
_ERRORS = frozenset(
    {
        "CodecError",
        "ConfigError",
        "CorruptTokenError",
        "FastRecoverError",
        "FencedError",
        "SchemaBehindError",
        "StateError",
        "StoreError",
        "StoreUnavailableError",
    }
)


def __getattr__(name: str) -> Any:
    if name == "Consumer":
        from fastrecover.consumer import Consumer

        return Consumer
    if name in _ERRORS or name == "errors":
        errors = importlib.import_module("fastrecover.errors")  # not "from fastrecover import": it asks here again
        return errors if name == "errors" else getattr(errors, name)
    raise AttributeError(f"module 'fastrecover' has no attribute {name!r}")


__all__ = [
    "CodecError",
    "ConfigError",
    "Consumer",
    "CorruptTokenError",
    "FastRecoverError",
    "FencedError",
    "SchemaBehindError",
    "StateError",
    "StoreError",
    "StoreUnavailableError",
    "__version__",
]
