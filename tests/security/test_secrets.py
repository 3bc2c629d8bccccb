"""No password in any output, log line, file, argv or repr (issue 11, "Secrets").

Every check searches for the secret itself (and its percent-encoded form), so a
masking that leaks part of a password (one with ``@`` or ``/``) fails too.
"""

from __future__ import annotations

import logging
import traceback
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from fastrecover import Consumer
from fastrecover.cli import main
from fastrecover.config import Settings, split_config
from fastrecover.errors import FastRecoverError
from fastrecover.store import build_engine, mask_url, open_store
from fastrecover.store.engine import has_secret, url_for_child
from fastrecover_tools.chaos.driver import ChaosConfig, ChaosDriver
from tests.integration.helpers import mode_of, parallel_config

SECRET = "Zx9s3cr3tQ"
FRAGMENTS = (SECRET, SECRET[:5], SECRET[-5:])


def _leaks(text: str) -> list[str]:
    found = [f for f in FRAGMENTS if f in text]
    encoded = urllib.parse.quote(SECRET, safe="")
    return found + ([encoded] if encoded in text else [])


def _cli(argv: list[str]) -> int:
    """main()'s exit code, argparse's usage errors (SystemExit) included."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)


def _chain_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


SECRET_URLS = [
    f"postgresql+psycopg://app:{SECRET}@db.example:5432/ranges",
    f"postgresql+psycopg://app:p@ss/{SECRET}@db.example/ranges",  # '@' and '/' in the password, unescaped
    f"postgresql+psycopg://app:{urllib.parse.quote('p@ss/' + SECRET, safe='')}@db.example/ranges",
    f"postgresql+psycopg://app@db.example/ranges?password={SECRET}",
    f"postgresql+psycopg://app@db.example/ranges?sslmode=require&sslpassword={SECRET}",
    f"postgresql+psycopg://app@db.example/ranges?PassWord={SECRET}&x=1",
    f"postgresql+psycopg://app@db.example/ranges?auth_token={SECRET}",
    f"postgresql+psycopg://app@db.example/ranges?client_secret={SECRET};x=1",
    f"mysql://app:{SECRET}@db.example/ranges",
    f"sqlite:///ranges.db?sslpassword={SECRET}",
]


@pytest.mark.parametrize("url", SECRET_URLS)
def test_mask_url_hides_every_secret(url: str) -> None:
    masked = mask_url(url)
    assert not _leaks(masked), masked
    assert "db.example" in masked or "sqlite" in masked
    assert has_secret(url)


@pytest.mark.parametrize("url", SECRET_URLS)
def test_mask_url_of_a_parsed_url(url: str) -> None:
    try:
        parsed = make_url(url)
    except Exception:
        pytest.skip("SQLAlchemy cannot parse it (the text form is covered above)")
    assert not _leaks(mask_url(parsed))


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql+psycopg://app:{SECRET}@",
        f"nosuchdialect://app:{SECRET}@db.example/x",
        f"app:{SECRET}@db.example/x",
        f"postgresql+psycopg://app:{SECRET}@db.example:notaport/x",
        f"sqlite:///x.db?timeout=abc&password={SECRET}",
    ],
)
def test_errors_for_malformed_urls_do_not_echo_the_secret(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        build_engine(url).dispose()  # lazy: a URL that parses only fails when it connects
    except FastRecoverError as exc:
        assert not _leaks(_chain_text(exc)), _chain_text(exc)
    with pytest.raises(FastRecoverError) as info:
        open_store(url, create=False)
    assert not _leaks(_chain_text(info.value)), _chain_text(info.value)
    with pytest.raises(FastRecoverError) as config_info:
        split_config(
            {"group.id": "g", "enable.parallel.rebalance": True, "fastrecover.store.url": url.split("://")[-1]}
        )
    assert not _leaks(str(config_info.value))
    code = _cli(["status", "--store-url", url])
    out, err = capsys.readouterr()
    assert code == 2
    # one error line; from argparse after its usage (which may wrap onto indented lines); no traceback
    *usage, error = err.strip().splitlines()
    assert error.startswith(("fastrecover: error: ", "fastrecover status: error: ")), err
    assert not usage or (usage[0].startswith("usage: ") and all(line.startswith(" ") for line in usage[1:])), err
    assert not _leaks(out + err)


def test_settings_repr_masks_the_url_the_mirror_key_and_child_secrets() -> None:
    _, settings = split_config(
        {
            "group.id": "g",
            "enable.parallel.rebalance": True,
            "fastrecover.store.url": SECRET_URLS[4],
            "fastrecover.commit.mirror.key": SECRET * 2,
            "fastrecover.child.sasl.password": SECRET,
            "fastrecover.child.ssl.key.password": SECRET,
            "fastrecover.child.sasl.oauthbearer.client.secret": SECRET,
        }
    )
    assert isinstance(settings, Settings)
    for text in (repr(settings), str(settings), f"{settings!r}"):
        assert not _leaks(text), text
    assert "db.example" in repr(settings)
    assert settings.commit_mirror_key == (SECRET * 2).encode()


def test_url_for_child_keeps_secrets_off_argv() -> None:
    url = f"postgresql+psycopg://app:{urllib.parse.quote('p@ss/' + SECRET, safe='')}@h:5/db?sslpassword={SECRET}"
    argv_url, env = url_for_child(url)
    assert not _leaks(argv_url)
    assert env["PGPASSWORD"] == "p@ss/" + SECRET
    assert env["FASTRECOVER_STORE_URL"] == url
    assert url_for_child("sqlite:///x.db") == ("sqlite:///x.db", {})


def test_chaos_config_repr_hides_the_store_password(tmp_path: Path) -> None:
    url = "postgresql+psycopg://fr:" + SECRET + "@db/fr"
    config = ChaosConfig(bootstrap="127.0.0.1:9", store_url=url, workdir=tmp_path)
    assert SECRET not in repr(config) and SECRET not in str(config)


def test_chaos_workers_get_the_secret_through_the_environment(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://app:{SECRET}@127.0.0.1:5432/db"
    driver = ChaosDriver(ChaosConfig(bootstrap="127.0.0.1:1", store_url=url, workdir=tmp_path, topics=1))
    argv, _, _, _ = driver._argv(driver.members[0], False)
    assert not _leaks(" ".join(argv))
    assert "--store-url" in argv
    assert driver._env["PGPASSWORD"] == SECRET


def test_demo_prints_a_masked_url(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from contextlib import contextmanager

    from fastrecover_tools import demo

    calls: list[dict[str, Any]] = []

    @contextmanager
    def fake_broker(bootstrap: str | None, out: Any) -> Any:
        yield "127.0.0.1:1", False

    def fake_story(bootstrap: str, **kwargs: Any) -> demo.DemoResult:
        calls.append(kwargs)
        return demo.DemoResult("x", "x", 0, 1.0, None, None, 0, 0, 0, 0, None)

    monkeypatch.setattr(demo, "_broker", fake_broker)
    monkeypatch.setattr(demo, "run_story", fake_story)
    monkeypatch.delenv("PGPASSWORD", raising=False)
    demo.main(
        "127.0.0.1:1", f"postgresql+psycopg://app:{SECRET}@h/db", 10, 0.1, 0, 1, out_dir=tmp_path / "o", picture=False
    )
    out = capsys.readouterr().out
    assert "store: postgresql+psycopg://app:***@h/db" in out
    assert not _leaks(out)
    import os

    assert os.environ.get("PGPASSWORD") == SECRET  # inherited by the worker processes, not on their argv
    monkeypatch.delenv("PGPASSWORD")
    monkeypatch.delenv("FASTRECOVER_STORE_URL", raising=False)


def test_consumer_logs_never_show_the_password(
    bootstrap: str,
    topic_factory: Any,
    unique_group: str,
    pg_url: str,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A working store URL with a password (PostgreSQL here trusts the role, so it is accepted) and a dead one."""
    from fastrecover_tools.testing.broker import produce

    topic = topic_factory(partitions=1)
    produce(bootstrap, topic, [f"r{i}" for i in range(300)], partition=0)
    base = make_url(pg_url)
    working = base.set(password=SECRET).render_as_string(hide_password=False) + f"?sslpassword={SECRET}"
    dead = base.set(password=SECRET, port=1).render_as_string(hide_password=False)
    caplog.set_level(logging.DEBUG)
    for url in (working, dead):
        consumer = Consumer(parallel_config(bootstrap, unique_group, url))
        try:
            assert mode_of(consumer) is not None
            assert not _leaks(repr(mode_of(consumer).settings))
            consumer.subscribe([topic])
            got = 0
            for _ in range(40):
                msg = consumer.poll(0.25)
                if msg is not None and msg.error() is None:
                    got += 1
            assert got > 0
        finally:
            consumer.close()
    out, err = capfd.readouterr()
    for record in caplog.records:
        text = record.getMessage() + (logging.Formatter().formatException(record.exc_info) if record.exc_info else "")
        assert not _leaks(text), text
    assert not _leaks(out + err)
    assert any("***" in r.getMessage() for r in caplog.records), "the dead store was reported, masked"


def test_cli_status_and_upgrade_print_masked_urls(pg_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = make_url(pg_url)
    url = base.set(password=SECRET).render_as_string(hide_password=False) + f"?sslpassword={SECRET}"
    dead = base.set(password=SECRET, port=1).render_as_string(hide_password=False)
    for argv in (
        ["status", "--store-url", url],
        ["status", "--store-url", dead],
        ["db", "upgrade", "--store-url", dead],
    ):
        assert _cli(argv) in (0, 2)
        out, err = capsys.readouterr()
        assert not _leaks(out + err), out + err


def test_chaos_command_never_shows_the_store_password(bootstrap: str, pg_url: str, tmp_path: Path) -> None:
    """The chaos CLI end to end (a tiny campaign) on a PostgreSQL store whose URL carries a password:
    nothing it prints, logs or writes (worker logs, ledgers, events, the verdict) holds the secret."""
    import json
    import os
    import subprocess
    import sys

    from fastrecover_tools.testing.broker import delete_topic

    repo = Path(__file__).resolve().parents[2]
    url = make_url(pg_url).set(password=SECRET).render_as_string(hide_password=False)
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(repo), str(repo / "tools"), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("PGPASSWORD", None)
    out = tmp_path / "verdict.json"
    argv = ["chaos", "--bootstrap-servers", bootstrap, "--store-url", url, "--cycles", "1", "--members", "1"]
    argv += ["--topics", "1", "--partitions", "2", "--rate", "100", "--up", "1,2", "--down", "0,1", "--seed", "3"]
    argv += ["--workdir", str(tmp_path / "run"), "--json", str(out)]
    proc = subprocess.run(
        [sys.executable, "-m", "fastrecover", *argv], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path
    )
    verdict = json.loads(out.read_text()) if out.exists() else {}
    try:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "***" in proc.stdout, "the store URL is shown, masked"
        assert not _leaks(proc.stdout + proc.stderr)
        written = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert any(p.suffix == ".log" for p in written), "the workers' logs were written"
        for path in written:
            assert not _leaks(path.read_text(errors="replace")), path
    finally:
        for topic in verdict.get("topics", []):
            delete_topic(bootstrap, topic)
