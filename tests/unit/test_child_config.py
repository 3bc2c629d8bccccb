"""The child consumer's configuration: what it inherits, drops and is given, and the overrides it refuses."""

from __future__ import annotations

import re
from typing import Any

import pytest

from fastrecover.child_config import CHILD_RECONNECT_BACKOFF_MS, child_config
from fastrecover.config import Settings, split_config
from fastrecover.errors import ConfigError

BASE: dict[str, Any] = {"bootstrap.servers": "localhost:9092", "group.id": "g"}


def enabled(**extra: Any) -> dict[str, Any]:
    return {**BASE, "enable.parallel.rebalance": True, **extra}


class TestChildConfig:
    def test_overrides_are_collected_and_stripped(self) -> None:
        overrides = {"fastrecover.child.fetch.max.bytes": 5, "fastrecover.child.debug": "x"}
        conf, s = split_config(enabled(**overrides))
        assert "fastrecover.child.fetch.max.bytes" not in conf
        assert s.child_overrides == {"fetch.max.bytes": 5, "debug": "x"}

    def test_child_reconnects_sooner_unless_the_application_says(self) -> None:
        assert child_config(BASE, Settings(enabled=True))["reconnect.backoff.ms"] == CHILD_RECONNECT_BACKOFF_MS
        assert (
            child_config({**BASE, "reconnect.backoff.ms": 250}, Settings(enabled=True))["reconnect.backoff.ms"] == 250
        )
        # librdkafka refuses reconnect.backoff.ms above reconnect.backoff.max.ms: an application's maximum
        # leaves both to it
        assert "reconnect.backoff.ms" not in child_config(
            {**BASE, "reconnect.backoff.max.ms": 5}, Settings(enabled=True)
        )
        overridden = Settings(enabled=True, child_overrides={"reconnect.backoff.ms": 40})
        assert child_config(BASE, overridden)["reconnect.backoff.ms"] == 40

    def test_child_never_joins_the_group_and_never_commits(self) -> None:
        primary = {
            **BASE,
            "group.instance.id": "static-1",
            "partition.assignment.strategy": "cooperative-sticky",
            "group.protocol": "classic",
            "enable.auto.commit": True,
            "enable.auto.offset.store": True,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": True,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 2000,
            "max.poll.interval.ms": 30000,
            "on_commit": print,
            "client.id": "app",
            "security.protocol": "SASL_SSL",
            "sasl.username": "u",
        }
        conf = child_config(primary, Settings(enabled=True))
        for key in (
            "group.instance.id",
            "partition.assignment.strategy",
            "group.protocol",
            "on_commit",
            "session.timeout.ms",
            "heartbeat.interval.ms",
            "max.poll.interval.ms",
        ):
            assert key not in conf
        assert conf["group.id"] == "g.fastrecover-child"
        assert conf["client.id"] == "app-fastrecover-child"
        assert conf["enable.auto.commit"] is False
        assert conf["enable.auto.offset.store"] is False
        assert conf["auto.offset.reset"] == "error"
        assert conf["enable.partition.eof"] is False
        assert conf["bootstrap.servers"] == "localhost:9092"
        assert conf["security.protocol"] == "SASL_SSL"
        assert conf["sasl.username"] == "u"
        assert "isolation.level" not in conf

    def test_default_client_id_and_isolation_level_kept(self) -> None:
        conf = child_config({**BASE, "isolation.level": "read_uncommitted"}, Settings(enabled=True))
        assert conf["client.id"] == "rdkafka-fastrecover-child"
        assert conf["isolation.level"] == "read_uncommitted"

    def test_overrides_win(self) -> None:
        settings = Settings(enabled=True, child_overrides={"fetch.wait.max.ms": 500, "client.id": "c"})
        conf = child_config(BASE, settings)
        assert conf["fetch.wait.max.ms"] == 500
        assert conf["client.id"] == "c"

    def test_primary_config_is_not_modified(self) -> None:
        primary = {**BASE, "client.id": "app"}
        child_config(primary, Settings(enabled=True))
        assert primary == {**BASE, "client.id": "app"}

    def test_end_to_end_from_split(self) -> None:
        conf, s = split_config(enabled(**{"fastrecover.child.fetch.min.bytes": 10}))
        child = child_config(conf, s)
        assert child["fetch.min.bytes"] == 10
        assert not any(k.startswith("fastrecover") or k.startswith("enable.parallel") for k in child)

    @pytest.mark.parametrize(
        ("key", "value", "named"),
        [
            ("enable.auto.commit", True, "range store"),
            ("enable.auto.commit", "true", "range store"),
            ("enable.auto.offset.store", 1, "delivery cursor"),
            ("enable.partition.eof", "t", "end-of-partition"),
            ("auto.offset.reset", "latest", "skip records still in the log"),
            ("auto.offset.reset", "earliest", "auto.offset.reset=error"),
            ("auto.offset.reset", "smallest", "auto.offset.reset=error"),
            ("isolation.level", "read_uncommitted", "'read_committed'"),
            ("group.id", "g", "the application's group"),
        ],
    )
    def test_an_override_the_child_rests_on_is_refused_naming_it(self, key: str, value: Any, named: str) -> None:
        """Each would let the child skip records still in the log, deliver others, or write to the group."""
        settings = Settings(enabled=True, child_overrides={key: value})
        with pytest.raises(ConfigError, match=rf"fastrecover\.child\.{re.escape(key)}=.*is refused") as err:
            child_config(BASE, settings)
        assert named in str(err.value)

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("enable.auto.commit", False),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", 0),
            ("auto.offset.reset", "error"),
            ("auto.offset.reset", "ERROR"),
            ("isolation.level", "read_committed"),
            ("isolation.level", "READ_COMMITTED"),
            ("group.id", "g-child-allowed-by-acls"),
        ],
    )
    def test_an_override_to_what_the_child_needs_anyway_is_taken(self, key: str, value: Any) -> None:
        conf = child_config(BASE, Settings(enabled=True, child_overrides={key: value}))
        assert conf[key] == value

    def test_the_isolation_level_override_must_be_the_primarys(self) -> None:
        primary = {**BASE, "isolation.level": "read_uncommitted"}
        taken = child_config(primary, Settings(enabled=True, child_overrides={"isolation.level": "read_uncommitted"}))
        assert taken["isolation.level"] == "read_uncommitted"
        with pytest.raises(ConfigError, match="'read_uncommitted'"):
            child_config(primary, Settings(enabled=True, child_overrides={"isolation.level": "read_committed"}))

    def test_a_refused_override_fails_the_construction_and_makes_no_handle(self) -> None:
        """The consumer's constructor refuses it before any librdkafka handle is made (nothing to close)."""
        from fastrecover import Consumer

        with pytest.raises(ConfigError, match=r"fastrecover\.child\.auto\.offset\.reset='latest' is refused"):
            Consumer(enabled(**{"fastrecover.child.auto.offset.reset": "latest"}))
