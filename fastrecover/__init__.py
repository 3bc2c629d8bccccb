"""fastrecover: KIP-333 ``enable.parallel.rebalance`` for confluent-kafka.

``Consumer`` is imported on first use (PEP 562): a process that only needs a
submodule (a Spark worker, the store CLI) does not pay for the consumer's
imports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from fastrecover.consumer import Consumer

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "Consumer":
        from fastrecover.consumer import Consumer

        return Consumer
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
