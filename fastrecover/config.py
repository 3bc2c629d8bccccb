"""Splitting and validating the consumer configuration.

``fastrecover.Consumer`` takes one dict, like ``confluent_kafka.Consumer``.  Our own keys
(``enable.parallel.rebalance`` and ``fastrecover.*``) are validated here and stripped; everything else
goes to librdkafka untouched, so librdkafka stays the judge of its own properties.  An unknown
``fastrecover.*`` key is an error, not a no-op: a typo there would quietly disable a safety setting.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import Any

from fastrecover.errors import ConfigError
from fastrecover.secrets import is_secret_key as is_secret_key  # the one masker, shared with the store and Spark
from fastrecover.secrets import mask_config as mask_config
from fastrecover.secrets import mask_url as _masked_url
from fastrecover.values import field, value

ENABLE_KEYS = ("enable.parallel.rebalance", "enable_parallel_rebalance")
PREFIX = "fastrecover."
CHILD_PREFIX = "fastrecover.child."
DEFAULT_STORE_FILE = "fastrecover.db"


def _default_store_url() -> str:
    return "sqlite:///" + os.path.join(os.getcwd(), DEFAULT_STORE_FILE)


_TRUE = ("true", "t", "1")
_FALSE = ("false", "f", "0")


def parse_bool(key: str, value: object) -> bool:
    """Booleans the way librdkafka accepts them: a bool, true/t/1 or false/f/0 (any case), an int 0 or 1
    (confluent_kafka hands librdkafka ``str(value)``).  librdkafka's own boolean keys are parsed with it too."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        text = value.strip().lower()
        if text in _TRUE:
            return True
        if text in _FALSE:
            return False
    raise ConfigError(f"{key}: expected a boolean (True/False, 'true'/'false', 't'/'f' or 1/0), got {value!r}")


_INTEGER = re.compile(r"-?[0-9]+")


def _int_parser(minimum: int, maximum: int | None = None) -> Callable[[str, object], int]:
    def parse(key: str, value: object) -> int:
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected an integer, got boolean {value!r}")
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and _INTEGER.fullmatch(value.strip()):
            number = int(value.strip())
        else:
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if number < minimum or (maximum is not None and number > maximum):
            bound = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise ConfigError(f"{key}: {number} is out of range, must be {bound}")
        return number

    return parse


def _store_url(key: str, value: object) -> str:
    if not isinstance(value, str) or "://" not in value:
        shown: object = value
        if isinstance(value, str):
            shown = _masked_url(value)
        elif isinstance(value, bytes):
            shown = _masked_url(value.decode("utf-8", "replace")).encode("utf-8")
        raise ConfigError(f"{key}: expected an SQLAlchemy URL such as sqlite:///fastrecover.db, got {shown!r}")
    return value


def _mirror_key(key: str, value: object) -> bytes:
    """A secret of at least 16 characters (bytes or text); never echoed in errors."""
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if not isinstance(raw, bytes) or len(raw) < 16:
        raise ConfigError(f"{key}: expected a secret of at least 16 characters (the value is not shown)")
    return raw


#: the key of the mirror's signing secret (also read by ``fastrecover rollback --command-config``)
MIRROR_KEY = "fastrecover.commit.mirror.key"


def parse_mirror_key(value: object) -> bytes:
    """The mirror key as the consumer reads it; ConfigError (value not shown) when it is too short."""
    return _mirror_key(MIRROR_KEY, value)


def _owner(key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip() or len(value) > 255:
        raise ConfigError(f"{key}: expected a non-empty string of at most 255 characters, got {value!r}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value):
        # PostgreSQL refuses NUL in text: every recovery would fail on the token write and fall back to a replay
        raise ConfigError(f"{key}: control characters (NUL, newline, ...) cannot be stored, got {value!r}")
    return value


@value
class _Key:
    default: Any
    parse: Callable[[str, object], Any]
    doc: str


#: Every fastrecover key, its default and parser; docs/configuration.md mirrors this table.
KEYS: dict[str, _Key] = {
    "fastrecover.store.url": _Key(
        None, _store_url, "SQLAlchemy URL of the range-token store (the child's commit log)."
    ),
    "fastrecover.store.create": _Key(
        True,
        parse_bool,
        "Create the schema in an empty store on first use (a store that is behind is refused).",
    ),
    "fastrecover.backfill.min.offsets": _Key(
        100,
        _int_parser(1),
        "Smallest lag E - C split off to the child; smaller lags are read by the primary.",
    ),
    "fastrecover.backfill.queue.max.messages": _Key(
        100_000,
        _int_parser(1, 10_000_000),  # librdkafka's bound on queued.min.messages
        "Records the child's handle prefetches per partition (its queued.min.messages); unread, it stops fetching.",
    ),
    "fastrecover.backfill.batch.size": _Key(
        500, _int_parser(1, 100_000), "Records the child fetches per consume() call."
    ),
    "fastrecover.commit.mirror": _Key(True, parse_bool, "Mirror open ranges into the primary's Kafka commit metadata."),
    "fastrecover.commit.out.of.order": _Key(
        False,
        parse_bool,
        "commit(message=m) and store_offsets(message=m) of a backfilled record mark m alone finished, for "
        "applications that finish records out of order; off, they mean what Kafka's commit means: every "
        "record of m's range up to m is done.",
    ),
    "fastrecover.owner.id": _Key(
        None, _owner, "Owner name written on claimed tokens (default: host, pid and a random suffix)."
    ),
    "fastrecover.revoke.timeout.ms": _Key(
        10_000,
        _int_parser(0, 600_000),
        "Accepted for compatibility and not read: a revoke takes the partition off the child at once.",
    ),
    "fastrecover.store.retry.backoff.ms": _Key(
        1_000, _int_parser(0, 600_000), "Wait before retrying a failed backfill commit to the store."
    ),
    "fastrecover.backfill.commit.interval.ms": _Key(
        200,
        _int_parser(1, 60_000),
        "Write-behind cadence: asynchronous backfill commits reach the store in one transaction this often.",
    ),
    "fastrecover.recovery.replay.max.offsets": _Key(
        10_000,
        _int_parser(0, 2**62),
        "While the store is still opening (the first recovery after start), a lag up to this is replayed by the "
        "primary instead of waiting for the store; a larger one too, until the store is open: then the primary "
        "skips from where its replay got to, the range written first. 0 makes every recovery wait for the store.",
    ),
    "fastrecover.recovery.jump.on.mirror": _Key(
        False,
        parse_bool,
        "A first recovery whose lag is above replay.max.offsets skips to the log end before the store has opened, "
        "its ranges durable in Kafka's commit metadata alone until then: its first fresh record comes sooner by "
        "the store's open, but an offset reset after a crash in that window loses them.",
    ),
    "fastrecover.recovery.timeout.ms": _Key(
        10_000,
        _int_parser(1, 600_000),
        "Broker timeout of recovery's look-ups (committed offsets, watermarks) when partitions are assigned.",
    ),
    MIRROR_KEY: _Key(
        None,
        _mirror_key,
        "Secret (>= 16 characters) that signs the commit-metadata mirror (HMAC-SHA256); when set, "
        "unsigned or foreign mirrors are ignored.",
    ),
    "fastrecover.store.lock.timeout.ms": _Key(
        5_000,
        _int_parser(1, 3_600_000),
        "Longest wait for a row lock (PostgreSQL lock_timeout) or the write lock (SQLite busy timeout).",
    ),
    "fastrecover.store.statement.timeout.ms": _Key(
        10_000,
        _int_parser(0, 3_600_000),
        "Longest run of one store statement (PostgreSQL statement_timeout; 0 = unbounded).",
    ),
}


@value
class Settings:
    """The validated fastrecover settings of one consumer, immutable.

    repr() masks the store URL's secrets, the mirror key and secret child overrides (settings end up in
    logs).  A :func:`~fastrecover.values.value`: a dataclass or typed NamedTuple cost 1-4 ms of every
    mode-on consumer's start.  :func:`split_config` fills every field; the defaults serve tests."""

    enabled: bool = False
    store_url: str = ""
    store_create: bool = True
    backfill_min_offsets: int = 100
    queue_max_messages: int = 100_000
    batch_size: int = 500
    commit_mirror: bool = True
    commit_out_of_order: bool = False
    owner_id: str | None = None
    revoke_timeout_s: float = 10.0
    retry_backoff_s: float = 1.0
    commit_interval_s: float = 0.2
    recovery_timeout_s: float = 10.0
    replay_max_offsets: int = 10_000
    jump_on_mirror: bool = False
    child_overrides: dict[str, Any] = field(default_factory=dict)
    commit_mirror_key: bytes | None = None
    store_lock_timeout_ms: int = 5_000
    store_statement_timeout_ms: int = 10_000

    @property
    def defers_store_open(self) -> bool:
        """Whether the store's open waits for the first recovery, so that a small lag's replay comes first.

        With ``fastrecover.recovery.replay.max.offsets`` 0 every recovery waits for the store: its open
        starts at construction, during the group join.  Above 0 a small lag is replayed without it, and a
        larger one starts the open when it needs it (or jumps on the commit metadata when allowed).
        """
        return self.replay_max_offsets > 0

    def __repr__(self) -> str:
        shown: dict[str, Any] = {}
        for name in self.__match_args__:
            value = getattr(self, name)
            if name == "store_url":
                value = _masked_url(value)
            elif name == "commit_mirror_key":
                value = None if value is None else "***"
            elif name == "child_overrides":
                value = mask_config(value)
            shown[name] = value
        return "Settings(" + ", ".join(f"{k}={v!r}" for k, v in shown.items()) + ")"


def mode_requested(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a consumer's arguments turn the mode on, read before they are validated.

    ``Consumer.__new__`` picks the class from this; a switch that does not parse counts as on, so
    that ``__init__`` (which validates everything) reports it.
    """
    conf = dict(args[0]) if args and isinstance(args[0], dict) else {}
    conf.update(kwargs)
    for key in ENABLE_KEYS:
        if key in conf:
            try:
                return parse_bool(key, conf[key])
            except ConfigError:
                return True
    return False


def split_config(config: Mapping[str, Any], **kwargs: Any) -> tuple[dict[str, Any], Settings]:
    """Return (librdkafka config, fastrecover settings) from a user config and kwargs.

    Keyword arguments merge over the dict, as confluent_kafka does for its own kwargs
    (``enable_parallel_rebalance=True`` is the Python spelling of the switch).
    """
    if not isinstance(config, Mapping):
        raise ConfigError(f"config must be a dict of properties, got {type(config).__name__}")
    merged: dict[str, Any] = dict(config)
    merged.update(kwargs)
    enabled = False
    values: dict[str, Any] = {}
    child: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    switches = {key: parse_bool(key, merged[key]) for key in ENABLE_KEYS if key in merged}
    if len(set(switches.values())) > 1:
        spelled = " and ".join(f"{k}={v}" for k, v in switches.items())
        raise ConfigError(f"conflicting spellings of the switch: {spelled}; give one of them")
    for key, given in merged.items():
        if not isinstance(key, str):
            raise ConfigError(f"config keys must be strings, got {key!r}")
        if key in ENABLE_KEYS:
            enabled = switches[key]
        elif key.startswith(CHILD_PREFIX):
            child[key[len(CHILD_PREFIX) :]] = given
        elif key.startswith(PREFIX):
            spec = KEYS.get(key)
            if spec is None:
                known = ", ".join(sorted(KEYS))
                raise ConfigError(f"unknown fastrecover key {key!r}; known keys: {known}, fastrecover.child.*")
            values[key] = spec.parse(key, given)
        else:
            passthrough[key] = given
    if enabled and not passthrough.get("group.id"):
        raise ConfigError("group.id must be set: enable.parallel.rebalance keeps its range tokens per consumer group")

    def get(key: str) -> Any:
        return values.get(key, KEYS[key].default)

    settings = Settings(
        enabled=enabled,
        store_url=get("fastrecover.store.url") or _default_store_url(),
        store_create=get("fastrecover.store.create"),
        backfill_min_offsets=get("fastrecover.backfill.min.offsets"),
        queue_max_messages=get("fastrecover.backfill.queue.max.messages"),
        batch_size=get("fastrecover.backfill.batch.size"),
        commit_mirror=get("fastrecover.commit.mirror"),
        commit_out_of_order=get("fastrecover.commit.out.of.order"),
        owner_id=get("fastrecover.owner.id"),
        revoke_timeout_s=get("fastrecover.revoke.timeout.ms") / 1000.0,
        retry_backoff_s=get("fastrecover.store.retry.backoff.ms") / 1000.0,
        commit_interval_s=get("fastrecover.backfill.commit.interval.ms") / 1000.0,
        recovery_timeout_s=get("fastrecover.recovery.timeout.ms") / 1000.0,
        replay_max_offsets=get("fastrecover.recovery.replay.max.offsets"),
        jump_on_mirror=get("fastrecover.recovery.jump.on.mirror"),
        child_overrides=child,
        commit_mirror_key=get(MIRROR_KEY),
        store_lock_timeout_ms=get("fastrecover.store.lock.timeout.ms"),
        store_statement_timeout_ms=get("fastrecover.store.statement.timeout.ms"),
    )
    return passthrough, settings


def is_cooperative(conf: Mapping[str, Any]) -> bool:
    """Whether rebalances hand out partitions incrementally (incremental_assign)."""
    strategy = str(conf.get("partition.assignment.strategy", ""))
    protocol = str(conf.get("group.protocol", "classic")).lower()
    return "cooperative" in strategy or protocol == "consumer"
