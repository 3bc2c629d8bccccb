"""fastrecover.switch: what a mode-on consumer's primary is made from before its keys are checked.

The early configuration must be exactly what the full check would give the primary, or None (the
check then runs first): a primary made from anything else would run with settings the application
did not give, or skip a refusal.
"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrecover.config import split_config
from fastrecover.errors import ConfigError
from fastrecover.switch import early_config, mode_requested, parse_bool, primary_config

BASE: dict[Any, Any] = {"bootstrap.servers": "127.0.0.1:9", "group.id": "g", "enable.parallel.rebalance": True}


def _checked_primary(config: dict[Any, Any], kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """What the full check gives the primary of a mode-on consumer; None where it refuses."""
    try:
        conf, settings = split_config(config, **kwargs)
        return primary_config(conf) if settings.enabled else None
    except ConfigError:
        return None


def test_the_primary_leaves_out_fastrecovers_keys_and_stores_no_offset_itself() -> None:
    config = {**BASE, "fastrecover.backfill.min.offsets": 5, "fastrecover.child.debug": "all", "client.id": "c"}
    assert early_config(config, {}) == {
        "bootstrap.servers": "127.0.0.1:9",
        "group.id": "g",
        "client.id": "c",
        "enable.auto.offset.store": False,
    }
    # an application that stores offsets itself keeps librdkafka's store off; kwargs merge over the dict
    own = early_config({**BASE, "enable.auto.offset.store": "false"}, {"session_timeout_ms": 1})
    assert own is not None and own["enable.auto.offset.store"] == "false" and own["session_timeout_ms"] == 1


@pytest.mark.parametrize(
    "config",
    [
        {"bootstrap.servers": "x", "group.id": "g"},  # the mode off: plain construction
        {**BASE, "enable.parallel.rebalance": False},
        {**BASE, "group.id": ""},  # the check's own error names group.id
        {k: v for k, v in BASE.items() if k != "group.id"},
        {**BASE, 7: "seven"},  # a key that is not a string
        {**BASE, "enable.auto.offset.store": "maybe"},  # does not parse: the check names it
    ],
)
def test_no_early_primary_where_the_check_must_speak_first(config: dict[Any, Any]) -> None:
    assert early_config(config, {}) is None


def test_a_switch_that_does_not_parse_counts_as_on_and_is_refused_by_the_check() -> None:
    assert mode_requested(({**BASE, "enable.parallel.rebalance": "perhaps"},), {})
    with pytest.raises(ConfigError, match=r"enable\.parallel\.rebalance"):
        parse_bool("enable.parallel.rebalance", "perhaps")


_KEYS = st.sampled_from(
    [
        "group.id",
        "client.id",
        "enable.auto.offset.store",
        "enable.parallel.rebalance",
        "enable_parallel_rebalance",
        "fastrecover.backfill.min.offsets",
        "fastrecover.child.fetch.max.bytes",
        "fastrecover.no.such.key",
        "session.timeout.ms",
    ]
)
_VALUES = st.one_of(st.booleans(), st.sampled_from(["true", "false", "0", "1", "", "g", "7", "x"]), st.integers(-1, 3))


@given(st.dictionaries(_KEYS, _VALUES, max_size=7), st.dictionaries(_KEYS.filter(lambda k: "." not in k), _VALUES))
def test_an_early_primary_is_the_one_the_check_gives(config: dict[str, Any], kwargs: dict[str, Any]) -> None:
    early = early_config(config, kwargs)
    if early is not None:
        checked = _checked_primary(config, kwargs)
        # the check may still refuse a fastrecover key: the consumer then closes the early primary
        assert checked is None or checked == early


def test_importing_the_consumer_leaves_the_configuration_check_unimported() -> None:
    """config (the key table, Settings), values, secrets and errors load at construction, after the
    primary's handle is made: a restart's first record does not wait for them (switch.py)."""
    later = ("fastrecover.config", "fastrecover.values", "fastrecover.secrets", "fastrecover.errors")
    code = f"import sys, fastrecover.consumer; print(','.join(m for m in {later!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == ""
