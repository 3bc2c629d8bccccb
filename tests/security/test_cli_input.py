"""Every bad CLI input of issue 11 ends in one line on stderr and a non-zero exit, quickly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*argv: str, timeout: float = 60) -> tuple[int, str, str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tools")]))
    env.pop("FASTRECOVER_BOOTSTRAP", None)  # the commands must use the broker given on the command line
    began = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "fastrecover", *argv], capture_output=True, text=True, env=env, timeout=timeout
    )
    return proc.returncode, proc.stdout, proc.stderr, time.monotonic() - began


def _one_error_line(err: str) -> str:
    """The one error line (argparse may print its usage lines before it; nothing else is allowed)."""
    lines = err.strip().splitlines()
    assert "Traceback" not in err
    errors = [line for line in lines if line.startswith("fastrecover") and ": error: " in line]
    assert len(errors) == 1 and lines[-1] == errors[0], err
    if len(lines) > 1:
        assert lines[0].startswith("usage: "), err
    return errors[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["demo", "--bootstrap-servers", "127.0.0.1:1", "--broker-timeout", "2"],
        ["chaos", "--bootstrap-servers", "127.0.0.1:1", "--broker-timeout", "2", "--cycles", "1"],
    ],
    ids=["demo", "chaos"],
)
def test_unreachable_broker(argv: list[str]) -> None:
    code, _, err, took = _run(*argv)
    assert code == 2
    assert "no Kafka broker answered at 127.0.0.1:1 within 2 s" in _one_error_line(err)
    assert took < 20


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--store-url", "sqlite:///a.db?timeout=abc"],
        ["db", "upgrade", "--store-url", "sqlite:///a.db?timeout=-5"],
        ["status", "--store-url", "not a url"],
        ["status", "--store-url", "postgresql+psycopg://u:pw@h:notaport/db"],
        ["demo", "--store-url", "sqlite:///a.db?timeout=x", "--bootstrap-servers", "127.0.0.1:1"],
        ["chaos", "--store-url", "nosuchdialect://x/y", "--bootstrap-servers", "127.0.0.1:1"],
        ["status", "--store-url", "sqlite:///a.db", "--group", "g" * 256],
        ["rollback", "--store-url", "sqlite:///a.db", "--group", "", "--bootstrap-servers", "127.0.0.1:1"],
    ],
)
def test_bad_input_is_one_line(argv: list[str], tmp_path: Path) -> None:
    code, _, err, _ = _run(*argv)
    assert code == 2
    _one_error_line(err)
    assert "pw@" not in err
