"""``fastrecover demo|bench|chaos`` without the fastrecover-tools distribution: one line naming it, exit 2."""

from __future__ import annotations

import sys

import pytest

from fastrecover import cli


@pytest.mark.parametrize("argv", [["demo"], ["demo", "--rate", "5"], ["bench", "--quick"], ["chaos", "--help"]])
def test_tool_commands_name_the_missing_package(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m == "fastrecover_tools" or m.startswith("fastrecover_tools.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "fastrecover_tools", None)  # import fails as if not installed

    assert cli.main(argv) == cli.EXIT_USAGE
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"fastrecover: error: {cli.TOOLS_MISSING.format(command=argv[0])}"]
    assert "pip install fastrecover-tools" in err[0]


def test_tool_commands_parse_when_the_tools_are_installed() -> None:
    pytest.importorskip("fastrecover_tools")
    args = cli.build_parser().parse_args(["bench", "--quick"])
    assert args.func is cli._cmd_bench
