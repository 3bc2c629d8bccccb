"""The chaos driver's command lines for its workers (no broker: the driver is only constructed)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fastrecover_tools.chaos import command
from fastrecover_tools.chaos.driver import ChaosConfig, ChaosDriver


def _argv(tmp_path: Path, **config: object) -> list[str]:
    driver = ChaosDriver(ChaosConfig(bootstrap="127.0.0.1:1", store_url="sqlite://", workdir=tmp_path, **config))  # type: ignore[arg-type]
    argv, _stall, _mode, _api = driver._argv(driver.members[0], False)
    return argv


def test_a_kip848_campaign_sets_the_workers_group_protocol(tmp_path: Path) -> None:
    argv = _argv(tmp_path, group_protocol="consumer", worker_args=["--set", "fetch.wait.max.ms=50"])
    at = argv.index("group.protocol=consumer")
    assert argv[at - 1] == "--set"
    assert argv[-2:] == ["--set", "fetch.wait.max.ms=50"], "the caller's worker_args come last"


def test_a_classic_campaign_leaves_the_client_default(tmp_path: Path) -> None:
    assert not [a for a in _argv(tmp_path) if a.startswith("group.protocol")]


def test_an_unknown_group_protocol_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"group_protocol must be one of .* got 'kip848'"):
        ChaosConfig(bootstrap="127.0.0.1:1", store_url="sqlite://", workdir=tmp_path, group_protocol="kip848")


def test_an_unknown_operator_action_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"operator actions must be among .* got \['reset-latest'\]"):
        ChaosConfig(bootstrap="127.0.0.1:1", store_url="sqlite://", workdir=tmp_path, operator_actions=["reset-latest"])


def _chaos_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_an_assignment_strategy_is_a_classic_groups_setting(tmp_path: Path) -> None:
    args = _chaos_args("--group-protocol", "consumer", "--assignment-strategy", "cooperative-sticky")
    with pytest.raises(SystemExit, match="--assignment-strategy cooperative-sticky is a classic group's setting"):
        command.run(args)
    assert _chaos_args("--assignment-strategy", "cooperative-sticky").assignment_strategy == "cooperative-sticky"
    with pytest.raises(SystemExit):
        _chaos_args("--assignment-strategy", "sticky")  # not one librdkafka's classic groups offer
