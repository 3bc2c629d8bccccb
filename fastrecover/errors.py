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
