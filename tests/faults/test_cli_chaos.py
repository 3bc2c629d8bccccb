"""``fastrecover chaos``: the long campaign's command, run end to end at a tiny size."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupType
from confluent_kafka.admin import AdminClient

from fastrecover_tools.testing.broker import delete_topic

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.broker  # asked for at run time, by the name in the parameter (tests/conftest.py: tiers)
@pytest.mark.parametrize(("group_protocol", "broker"), [("classic", "bootstrap"), ("consumer", "kip848_bootstrap")])
def test_chaos_command_prints_the_table_and_writes_the_verdict(
    group_protocol: str, broker: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    bootstrap: str = request.getfixturevalue(broker)
    out = tmp_path / "verdict.json"
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tools"), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fastrecover",
            "chaos",
            "--bootstrap-servers",
            bootstrap,
            "--cycles",
            "3",
            "--members",
            "2",
            "--topics",
            "1",
            "--partitions",
            "3",
            "--rate",
            "100",
            "--up",
            "1,2",
            "--down",
            "0,1",
            "--seed",
            "1",
            "--group-protocol",
            group_protocol,
            "--workdir",
            str(tmp_path / "run"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=str(tmp_path),
    )
    verdict = json.loads(out.read_text()) if out.exists() else {}
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "| records lost" in proc.stdout and "verdict: PASS: nothing lost" in proc.stdout, proc.stdout
        assert verdict["verdict"]["ok"] and verdict["verdict"]["lost"] == 0
        assert verdict["verdict"]["kills"] >= 3
        assert f"({group_protocol} group)" in proc.stdout, proc.stdout[:500]
        # the broker's word that the members formed a group of that protocol
        group = verdict["group"]
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept: a collected client never answers
        described = admin.describe_consumer_groups([group])[group].result(timeout=30)
        expected = ConsumerGroupType.CONSUMER if group_protocol == "consumer" else ConsumerGroupType.CLASSIC
        assert described.type == expected, described
    finally:
        for topic in verdict.get("topics", []):
            delete_topic(bootstrap, topic)
