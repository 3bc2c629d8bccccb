"""``fastrecover rollback``'s command line, where no broker is needed to answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from fastrecover.cli import main


def test_a_command_config_librdkafka_refuses_is_one_line_naming_the_property(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No broker is asked: the admin client refuses the file's property before any connection."""
    config = tmp_path / "admin.properties"
    config.write_text("security.protocol=SASL_SSL\nno.such.property=1\n")
    code = main(
        [
            "rollback",
            "--group",
            "g",
            "--store-url",
            f"sqlite:///{tmp_path / 'ranges.db'}",
            "--bootstrap-servers",
            "127.0.0.1:1",
            "--command-config",
            str(config),
        ]
    )
    _out, err = capsys.readouterr()
    assert code == 2
    assert err.strip() == (
        "fastrecover: error: the admin client refused its configuration (--command-config): "
        'No such configuration property: "no.such.property"'
    )
