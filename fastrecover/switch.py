"""What a consumer's arguments say before they are checked: whether the mode is on, and librdkafka's part.

``fastrecover.consumer`` imports this module, not :mod:`fastrecover.config`.  A mode-on consumer makes
its primary's librdkafka handle from :func:`early_config` first and checks fastrecover's own keys
after: the key table, ``Settings`` and their imports take about 3 ms, and librdkafka's threads
connect to the bootstrap broker meanwhile, time a restart's group join spends waiting anyway.  A
restarted process's first fresh record no longer waits for them.  Nothing here decides what the
check decides: where these answers could differ from it, :func:`early_config` answers None and the
check runs first, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the two spellings of the mode's switch: the KIP's property and the Python keyword argument
ENABLE_KEYS = ("enable.parallel.rebalance", "enable_parallel_rebalance")
PREFIX = "fastrecover."
CHILD_PREFIX = "fastrecover.child."

_TRUE = ("true", "t", "1")
_FALSE = ("false", "f", "0")


def parse_bool(key: str, value: object) -> bool:
    """Booleans the way librdkafka accepts them.

    A bool, or a string true/t/1 or false/f/0 (any case); an int 0 or 1 too, since
    confluent_kafka hands librdkafka ``str(value)``.  The consumer also parses
    librdkafka's own boolean keys with this, so it must not refuse what librdkafka takes.
    """
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
    from fastrecover.errors import ConfigError

    raise ConfigError(f"{key}: expected a boolean (True/False, 'true'/'false', 't'/'f' or 1/0), got {value!r}")


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
            except ValueError:  # ConfigError
                return True
    return False


def primary_config(conf: Mapping[str, Any]) -> dict[str, Any]:
    """The primary's librdkafka properties, from the application's (fastrecover's keys already left out).

    fastrecover stores the primary's offsets itself, one call late and with the range mirror: a
    record counts as done once the application comes back for more.  So librdkafka's automatic
    offset store goes off, unless the application turned it off itself (then it stores them).
    """
    out = dict(conf)
    if parse_bool("enable.auto.offset.store", conf.get("enable.auto.offset.store", True)):
        out["enable.auto.offset.store"] = False
    return out


def early_config(config: Mapping[str, Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The primary's librdkafka properties of a mode-on consumer, before fastrecover's keys are checked.

    None, so that the full check runs first and raises its own error, when the mode is not asked
    for or when the check could refuse what this would pass: keys that are not strings, no
    ``group.id``, an ``enable.auto.offset.store`` that does not parse.
    """
    if not isinstance(config, dict) or not mode_requested((config,), kwargs):
        return None
    merged = {**config, **kwargs}
    passthrough: dict[str, Any] = {}
    for key, value in merged.items():
        if not isinstance(key, str):
            return None
        if key not in ENABLE_KEYS and not key.startswith(PREFIX):
            passthrough[key] = value
    if not passthrough.get("group.id"):
        return None
    try:
        return primary_config(passthrough)
    except ValueError:  # ConfigError: the check names the key
        return None
