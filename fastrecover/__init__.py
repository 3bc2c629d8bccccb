"""fastrecover: KIP-333 ``enable.parallel.rebalance`` for confluent-kafka."""

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
