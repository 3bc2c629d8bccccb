"""The exceptions fastrecover raises.

Every error is ours (so callers can catch ``FastRecoverError``) and carries the
underlying cause as ``__cause__`` when there is one, so driver noise stays out of
the message but is never lost for debugging.
"""

from __future__ import annotations


class FastRecoverError(Exception):
    """Base of every error raised by fastrecover."""


class ConfigError(FastRecoverError, ValueError):
    """A configuration key or value is invalid; the message names the key and value."""


class StoreError(FastRecoverError):
    """The range-token store failed."""


class StoreUnavailableError(StoreError):
    """The store cannot be reached (connection refused, file locked or missing)."""


class SchemaBehindError(StoreError):
    """The store's schema is older than this library needs; ``fastrecover db upgrade`` fixes it."""


class CorruptTokenError(StoreError):
    """A token row violates the range invariants (e.g. end < start) or cannot be decoded."""


class FencedError(StoreError):
    """A range is held by another owner or a newer epoch; the stale holder must stop."""


class CodecError(FastRecoverError, ValueError):
    """An encoded completion map or commit-metadata mirror cannot be decoded."""


class StateError(FastRecoverError):
    """An operation is not valid in the consumer's current state (e.g. commit of an unassigned partition)."""


class TokenNotFoundError(StoreError, LookupError):
    """No range token has the requested id (it was never created or was deleted by hand)."""


class StoreCorruptError(StoreUnavailableError):
    """The store's file is not a usable database (corrupt, truncated, or not SQLite at all).

    A subclass of StoreUnavailableError on purpose: a consumer treats a corrupt
    store like an unreachable one (it degrades to a plain consumer and logs),
    since neither can tell it anything about its ranges; the CLI prints it as a
    one-line error.
    """


class InvalidValueError(StoreError, ValueError):
    """A value handed to the store is out of what it can hold (e.g. an offset above BIGINT)."""


class SchemaLockTimeoutError(StoreUnavailableError):
    """Another upgrade held the schema lock for longer than we may wait."""


class BrokerUnavailableError(FastRecoverError):
    """The Kafka cluster did not answer within the command's timeout."""


class DataLossError(FastRecoverError):
    """Records a batch must deliver are gone from Kafka (retention, topic re-created)."""


class OffsetFormatError(FastRecoverError, ValueError):
    """A serialized source offset is not one this version wrote (or was edited by hand)."""


class CheckpointError(FastRecoverError):
    """A Spark checkpoint file is missing, malformed or inconsistent with the others."""


class FrozenInstanceError(FastRecoverError, AttributeError):
    """An assignment to a field of a frozen value (fastrecover.values.value): values are never changed in place."""
