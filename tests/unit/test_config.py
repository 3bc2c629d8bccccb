"""Unit tests of configuration splitting and validation (fastrecover.config)."""

from __future__ import annotations

import os
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastrecover.config import (
    KEYS,
    Settings,
    is_cooperative,
    parse_bool,
    split_config,
)
from fastrecover.errors import ConfigError, FastRecoverError

BASE: dict[str, Any] = {"bootstrap.servers": "localhost:9092", "group.id": "g"}
INT_KEYS = {
    "fastrecover.backfill.min.offsets": (1, None),
    "fastrecover.backfill.queue.max.messages": (1, 10_000_000),
    "fastrecover.backfill.batch.size": (1, 100_000),
    "fastrecover.revoke.timeout.ms": (0, 600_000),
    "fastrecover.store.retry.backoff.ms": (0, 600_000),
}
BOOL_KEYS = ("fastrecover.store.create", "fastrecover.commit.mirror")


def enabled(**extra: Any) -> dict[str, Any]:
    return {**BASE, "enable.parallel.rebalance": True, **extra}


# ---- defaults and pass-through ---------------------------------------------------------------------


class TestSplit:
    def test_disabled_by_default_and_everything_passes_through(self) -> None:
        conf, settings = split_config(dict(BASE, **{"auto.offset.reset": "earliest"}))
        assert conf == {**BASE, "auto.offset.reset": "earliest"}
        assert settings.enabled is False

    def test_defaults(self) -> None:
        _, s = split_config(enabled())
        assert s == Settings(enabled=True, store_url=s.store_url)
        assert s.store_url == "sqlite:///" + os.path.join(os.getcwd(), "fastrecover.db")
        assert (s.backfill_min_offsets, s.queue_max_messages, s.batch_size) == (100, 100_000, 500)
        assert s.store_create is True
        assert s.commit_mirror is True
        assert s.owner_id is None
        assert s.revoke_timeout_s == 10.0
        assert s.retry_backoff_s == 1.0
        assert s.child_overrides == {}

    def test_defaults_match_the_key_table(self) -> None:
        _, s = split_config(enabled())
        assert s.backfill_min_offsets == KEYS["fastrecover.backfill.min.offsets"].default
        assert s.queue_max_messages == KEYS["fastrecover.backfill.queue.max.messages"].default
        assert s.batch_size == KEYS["fastrecover.backfill.batch.size"].default
        assert s.revoke_timeout_s * 1000 == KEYS["fastrecover.revoke.timeout.ms"].default
        assert s.retry_backoff_s * 1000 == KEYS["fastrecover.store.retry.backoff.ms"].default
        assert all(spec.doc for spec in KEYS.values())

    def test_own_keys_are_validated_and_stripped(self) -> None:
        conf, s = split_config(
            enabled(
                **{
                    "fastrecover.store.url": "postgresql+psycopg://u@h/db",
                    "fastrecover.store.create": "false",
                    "fastrecover.backfill.min.offsets": "250",
                    "fastrecover.backfill.queue.max.messages": 77,
                    "fastrecover.backfill.batch.size": " 12 ",
                    "fastrecover.commit.mirror": False,
                    "fastrecover.owner.id": "worker-1",
                    "fastrecover.revoke.timeout.ms": 2500,
                    "fastrecover.store.retry.backoff.ms": "0",
                    "fastrecover.child.fetch.max.bytes": 1024,
                }
            )
        )
        assert conf == BASE
        assert s.enabled is True
        assert s.store_url == "postgresql+psycopg://u@h/db"
        assert s.store_create is False
        assert s.backfill_min_offsets == 250
        assert s.queue_max_messages == 77
        assert s.batch_size == 12
        assert s.commit_mirror is False
        assert s.owner_id == "worker-1"
        assert s.revoke_timeout_s == 2.5
        assert s.retry_backoff_s == 0.0
        assert s.child_overrides == {"fetch.max.bytes": 1024}

    def test_own_keys_validated_even_when_disabled(self) -> None:
        with pytest.raises(ConfigError, match=r"fastrecover\.backfill\.batch\.size"):
            split_config(dict(BASE, **{"fastrecover.backfill.batch.size": 0}))

    def test_kwargs_merge_over_the_dict(self) -> None:
        conf, s = split_config(BASE, enable_parallel_rebalance=True, **{"group.id": "other"})
        assert s.enabled is True
        assert conf["group.id"] == "other"

    def test_input_is_not_modified(self) -> None:
        original = enabled(**{"fastrecover.child.x": 1})
        copy = dict(original)
        split_config(original)
        assert original == copy

    def test_config_must_be_a_mapping(self) -> None:
        with pytest.raises(ConfigError, match="list"):
            split_config([("group.id", "g")])  # type: ignore[arg-type]

    def test_keys_must_be_strings(self) -> None:
        with pytest.raises(ConfigError, match="42"):
            split_config({42: "x"})  # type: ignore[dict-item]

    def test_config_error_is_ours_and_a_value_error(self) -> None:
        with pytest.raises(FastRecoverError):
            split_config(enabled(**{"fastrecover.nope": 1}))
        with pytest.raises(ValueError):
            split_config(enabled(**{"fastrecover.nope": 1}))


class TestEnableSwitch:
    @pytest.mark.parametrize("key", ["enable.parallel.rebalance", "enable_parallel_rebalance"])
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (True, True),
            (False, False),
            ("true", True),
            ("false", False),
            ("TRUE", True),
            (" False ", False),
            ("t", True),
            ("f", False),
            ("1", True),
            ("0", False),
            (1, True),
            (0, False),
        ],
    )
    def test_spellings(self, key: str, value: object, expected: bool) -> None:
        conf, s = split_config({**BASE, key: value})
        assert s.enabled is expected
        assert key not in conf

    def test_python_kwarg(self) -> None:
        _, s = split_config(BASE, enable_parallel_rebalance=True)
        assert s.enabled is True

    @pytest.mark.parametrize("value", ["yes", "on", "", 2, -1, 1.0, None, [], "tru"])
    def test_bad_values_name_key_and_value(self, value: object) -> None:
        with pytest.raises(ConfigError) as info:
            split_config({**BASE, "enable.parallel.rebalance": value})
        assert "enable.parallel.rebalance" in str(info.value)
        assert repr(value) in str(info.value)

    @pytest.mark.parametrize("conf", [{}, {"group.id": ""}, {"group.id": None}, {"bootstrap.servers": "x"}])
    def test_group_id_required_when_enabled(self, conf: dict[str, Any]) -> None:
        with pytest.raises(ConfigError, match=r"group\.id"):
            split_config({**conf, "enable.parallel.rebalance": True})

    def test_group_id_not_required_when_disabled(self) -> None:
        _, s = split_config({"enable.parallel.rebalance": False})
        assert s.enabled is False


# ---- validation of every key -----------------------------------------------------------------------


class TestValidation:
    def test_unknown_key_is_an_error_listing_the_known_ones(self) -> None:
        with pytest.raises(ConfigError) as info:
            split_config(enabled(**{"fastrecover.backfill.min.offset": 5}))
        message = str(info.value)
        assert "'fastrecover.backfill.min.offset'" in message
        for key in KEYS:
            assert key in message
        assert "fastrecover.child.*" in message

    def test_keys_outside_the_prefix_pass_through(self) -> None:
        conf, _ = split_config(enabled(**{"fastrecoverx.y": 1, "Fastrecover.store.url": "z"}))
        assert conf["fastrecoverx.y"] == 1
        assert conf["Fastrecover.store.url"] == "z"

    @pytest.mark.parametrize("key", sorted(INT_KEYS))
    @pytest.mark.parametrize(
        "value",
        ["abc", "1.5", 1.5, "1e3", "0x10", "--5", "5-", "²", "٣", "", " ", None, [], True, False, "+-1"],
    )
    def test_int_keys_reject_non_integers(self, key: str, value: object) -> None:
        with pytest.raises(ConfigError) as info:
            split_config(enabled(**{key: value}))
        message = str(info.value)
        assert key in message
        assert repr(value) in message

    @pytest.mark.parametrize("key", sorted(INT_KEYS))
    def test_int_keys_bounds(self, key: str) -> None:
        low, high = INT_KEYS[key]
        for ok in (low, str(low), high) if high is not None else (low, str(low), 10**9):
            split_config(enabled(**{key: ok}))
        bad: list[int | str] = [low - 1, str(low - 1), -(10**12)]
        if high is not None:
            bad += [high + 1, str(high + 1)]
        for value in bad:
            with pytest.raises(ConfigError) as info:
                split_config(enabled(**{key: value}))
            message = str(info.value)
            assert key in message
            assert str(int(value)) in message
            assert re.search(r"out of range, must be (>= -?\d+|in \[\d+, \d+\])", message)

    @given(st.integers(-(10**6), 10**6), st.booleans())
    def test_int_parsing_matches_python(self, number: int, as_text: bool) -> None:
        key = "fastrecover.revoke.timeout.ms"
        value: object = str(number) if as_text else number
        if 0 <= number <= 600_000:
            assert split_config(enabled(**{key: value}))[1].revoke_timeout_s == number / 1000.0
        else:
            with pytest.raises(ConfigError, match=key):
                split_config(enabled(**{key: value}))

    @given(st.text(max_size=8))
    def test_int_parsing_of_arbitrary_text_never_escapes_as_another_error(self, text: str) -> None:
        key = "fastrecover.backfill.queue.max.messages"
        try:
            _, s = split_config(enabled(**{key: text}))
        except ConfigError as exc:
            assert key in str(exc)
        else:
            assert s.queue_max_messages == int(text.strip())
            assert text.strip().isascii()

    @pytest.mark.parametrize("key", BOOL_KEYS)
    @pytest.mark.parametrize("value", ["yes", "no", 2, None, "", 0.0])
    def test_bool_keys(self, key: str, value: object) -> None:
        with pytest.raises(ConfigError) as info:
            split_config(enabled(**{key: value}))
        assert key in str(info.value)
        assert repr(value) in str(info.value)

    @pytest.mark.parametrize("value", ["", "fastrecover.db", "/tmp/x.db", None, 5, b"sqlite:///x"])
    def test_store_url(self, value: object) -> None:
        with pytest.raises(ConfigError) as info:
            split_config(enabled(**{"fastrecover.store.url": value}))
        assert "fastrecover.store.url" in str(info.value)
        assert repr(value) in str(info.value)

    @pytest.mark.parametrize("value", ["", "   ", None, 5, "x" * 256])
    def test_owner_id(self, value: object) -> None:
        with pytest.raises(ConfigError) as info:
            split_config(enabled(**{"fastrecover.owner.id": value}))
        assert "fastrecover.owner.id" in str(info.value)

    def test_owner_id_at_the_limit(self) -> None:
        assert split_config(enabled(**{"fastrecover.owner.id": "x" * 255}))[1].owner_id == "x" * 255


class TestParseBool:
    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            (True, True),
            (False, False),
            ("true", True),
            ("True", True),
            ("FALSE", False),
            ("t", True),
            ("F", False),
            ("1", True),
            ("0", False),
            (1, True),
            (0, False),
            (" true ", True),
        ],
    )
    def test_accepted(self, value: object, expected: bool) -> None:
        assert parse_bool("k", value) is expected

    def test_librdkafka_keys_the_consumer_parses(self) -> None:
        # the consumer reads enable.auto.commit with parse_bool; librdkafka accepts these spellings
        assert parse_bool("enable.auto.commit", "0") is False
        assert parse_bool("enable.auto.commit", "f") is False
        assert parse_bool("enable.auto.offset.store", 1) is True


# ---- child overrides and the child's config --------------------------------------------------------


class TestCooperative:
    @pytest.mark.parametrize(
        ("conf", "expected"),
        [
            ({}, False),
            ({"partition.assignment.strategy": "range,roundrobin"}, False),
            ({"partition.assignment.strategy": "cooperative-sticky"}, True),
            ({"group.protocol": "consumer"}, True),
            ({"group.protocol": "CONSUMER"}, True),
            ({"group.protocol": "classic"}, False),
            ({"group.protocol": "classic", "partition.assignment.strategy": "cooperative-sticky"}, True),
        ],
    )
    def test_is_cooperative(self, conf: dict[str, Any], expected: bool) -> None:
        assert is_cooperative(conf) is expected


class TestIssueFindings:
    def test_conflicting_spellings_of_the_switch_are_refused(self) -> None:
        with pytest.raises(ConfigError, match="conflicting spellings") as info:
            split_config({"group.id": "g", "enable.parallel.rebalance": False}, enable_parallel_rebalance=True)
        assert "enable.parallel.rebalance=False" in str(info.value)
        assert "enable_parallel_rebalance=True" in str(info.value)

    def test_agreeing_spellings_are_one_switch(self) -> None:
        _conf, settings = split_config(
            {"group.id": "g", "enable.parallel.rebalance": "true"}, enable_parallel_rebalance=True
        )
        assert settings.enabled

    @pytest.mark.parametrize("owner", ["a\x00b", "line\nbreak", "tab\there", "del\x7f"])
    def test_an_owner_id_a_store_cannot_hold_is_refused(self, owner: str) -> None:
        with pytest.raises(ConfigError, match=r"fastrecover\.owner\.id: control characters"):
            split_config(enabled(**{"fastrecover.owner.id": owner}))

    def test_commits_mean_what_kafkas_mean_unless_asked_otherwise(self) -> None:
        assert not split_config(enabled())[1].commit_out_of_order
        assert split_config(enabled(**{"fastrecover.commit.out.of.order": "true"}))[1].commit_out_of_order
