"""``fastrecover bench`` never prints or writes a password (issue 11): masking and scrubbing, pure."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fastrecover_tools.bench.redact import mask_command, mask_url, scrub, url_secrets

PG = "postgresql+psycopg://fastrecover:S3cret@127.0.0.1:5432/postgres"


def test_mask_url_hides_userinfo_and_query_passwords() -> None:
    assert mask_url(PG) == "postgresql+psycopg://fastrecover:***@127.0.0.1:5432/postgres"
    assert mask_url("postgresql://u@h/db?password=pw&sslmode=require") == (
        "postgresql://u@h/db?password=***&sslmode=require"
    )
    assert "k3y" not in mask_url("postgresql://u@h/db?sslpassword=k3y")
    assert mask_url("sqlite:///tmp/x.db") == "sqlite:///tmp/x.db"
    assert mask_url("postgresql://u@h/db") == "postgresql://u@h/db"
    assert mask_url("--repeats") == "--repeats"


def test_password_with_at_slash_and_colon_is_hidden_whole() -> None:
    url = "postgresql://app:p@ss/w:rd@db.example:5432/ranges"
    masked = mask_url(url)
    assert masked == "postgresql://app:***@db.example:5432/ranges"
    assert set(url_secrets(url)) >= {"p@ss/w:rd"}


def test_mask_command_covers_both_flag_forms() -> None:
    words = ["fastrecover", "bench", "--pg-url", PG, f"--pg-url={PG}", "--quick"]
    masked = mask_command(words)
    assert "S3cret" not in " ".join(masked)
    assert masked[-1] == "--quick" and masked[4].startswith("--pg-url=postgresql+psycopg://fastrecover:***@")


def test_url_secrets_include_encoded_and_decoded_forms() -> None:
    secrets = url_secrets("postgresql://u:a%40b@h/db?password=x%2Fy")
    assert {"a%40b", "a@b", "x/y"} <= set(secrets)
    assert url_secrets("not a url") == []
    assert url_secrets("postgresql://u@h/db") == []


@settings(deadline=None)  # a busy 2-core machine: no per-example time limit
@given(st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=30))
def test_any_password_is_masked_and_scrubbed(password: str) -> None:
    from urllib.parse import quote

    masked_url = "postgresql+psycopg://user:***@host:5432/db"
    expected = f"failed to connect to {masked_url}; password=***"
    # A password that is itself a piece of the masked text ("d", "=***", "r:**") cannot be told
    # apart from that text by a substring test; the exact comparison below covers the rest.
    assume(password not in expected)
    encoded = quote(password, safe="")
    url = f"postgresql+psycopg://user:{encoded}@host:5432/db"
    assert mask_url(url) == masked_url
    assert mask_url(f"postgresql://user@host/db?password={encoded}") == "postgresql://user@host/db?password=***"
    cleaned = scrub(f"failed to connect to {url}; password={password}", url_secrets(url))
    assert cleaned == expected


def test_options_and_outputs_never_carry_the_password(tmp_path: Path) -> None:
    """The command recorded in results.json is masked, and a store error echoing the URL is scrubbed."""
    from fastrecover_tools.bench import command
    from fastrecover_tools.bench.run import BenchOptions, write_outputs

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    argv = ["bench", "--quick", "--pg-url", PG, "--out", str(tmp_path), "--doc", ""]
    opts = command.options_from_args(parser.parse_args(argv[1:]), argv)
    assert isinstance(opts, BenchOptions)
    assert "S3cret" not in opts.command and "fastrecover:***@" in opts.command
    assert opts.pg_url == PG  # the bench itself still connects with it
    result: dict[str, Any] = {
        "schema": 2,
        "command": opts.command,
        "started": "t0",
        "finished": "t1",
        "store": {"postgresql": {"error": f"could not connect to {PG}"}},
    }
    paths = write_outputs(result, opts)
    for path in paths.values():
        if path.suffix in (".json", ".md"):
            assert "S3cret" not in path.read_text(), path
    assert json.loads(paths["json"].read_text())["store"]["postgresql"]["error"].startswith("could not connect")
