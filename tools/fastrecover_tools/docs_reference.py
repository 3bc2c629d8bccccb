"""The documentation's reference tables, generated from the code they describe.

The site (``mkdocs build``, run by ``make lint``) replaces a marker line such as
``<!-- reference:config-keys -->`` in a page under ``docs/`` with the table this
module builds (``docs_hooks.py`` at the repository root calls :func:`expand`).
Every table is built from what the code itself uses, so it cannot drift:

- configuration keys: ``fastrecover.config.KEYS``, the table ``split_config``
  validates against, plus the switch (``ENABLE_KEYS``) and the child prefix;
- command line: the ``argparse`` parser ``fastrecover`` runs;
- Spark options: ``fastrecover.spark.options.OPTION_DOCS``.

``tests/unit/test_docs_reference.py`` checks that these tables name exactly the
code's keys, commands and options, and that no page names one the code lacks.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from fastrecover import cli, config

#: environment variables the CLI reads for its defaults; cleared while the parser is built, so the
#: generated page shows the defaults a user gets, not those of the machine that built the site
_CLI_ENV = ("FASTRECOVER_STORE_URL", "FASTRECOVER_BOOTSTRAP")


def _cell(text: object) -> str:
    """One Markdown table cell: no line breaks, no bare pipe."""
    return " ".join(str(text).split()).replace("|", "\\|")


# -- configuration keys ---------------------------------------------------------------------------


def config_keys() -> set[str]:
    """Every key ``fastrecover.Consumer`` accepts of its own (the child overrides as one pattern)."""
    return {*config.ENABLE_KEYS, *config.KEYS, config.CHILD_PREFIX + "<librdkafka key>"}


def _accepted(parse: Callable[[str, object], Any]) -> str:
    """What a key's parser accepts, read from the parser itself."""
    if parse is config.parse_bool:
        return "bool"
    names = parse.__code__.co_freevars
    if parse.__closure__ is not None and "minimum" in names:
        bounds = dict(zip(names, (c.cell_contents for c in parse.__closure__), strict=True))
        low, high = bounds["minimum"], bounds.get("maximum")
        return f"int ≥ {low}" if high is None else f"int {low}…{high}"
    return {
        "_store_url": "SQLAlchemy URL",
        "_owner": "string, 1…255 characters",
        "_mirror_key": "secret, ≥ 16 characters",
    }.get(parse.__name__, "see below")


_DEFAULTS_SHOWN = {
    "fastrecover.store.url": "`sqlite:///<working directory>/" + config.DEFAULT_STORE_FILE + "`",
    "fastrecover.owner.id": "`host:pid:random`",
}


def _default(key: str, value: object) -> str:
    if key in _DEFAULTS_SHOWN:
        return _DEFAULTS_SHOWN[key]
    if value is None:
        return "unset"
    return f"`{value}`"


def config_keys_table() -> str:
    """The configuration reference table."""
    rows = [
        "| key | accepts | default | what it does |",
        "| --- | --- | --- | --- |",
    ]
    switch, python_spelling = config.ENABLE_KEYS
    rows.append(
        f"| `{switch}` | bool | `False` | The KIP-333 switch. Off, the object is a `confluent_kafka.Consumer` "
        "whose methods are confluent_kafka's own: no store, no child consumer, no extra broker call. |"
    )
    rows.append(
        f"| `{python_spelling}` | bool | `False` | The Python spelling of the same switch, as a dict key or a "
        "keyword argument. |"
    )
    for key in sorted(config.KEYS):
        spec = config.KEYS[key]
        rows.append(f"| `{key}` | {_accepted(spec.parse)} | {_default(key, spec.default)} | {_cell(spec.doc)} |")
    rows.append(
        f"| `{config.CHILD_PREFIX}<librdkafka key>` | any | — | Sets one librdkafka property of the child "
        "consumer only, applied last, checked when the consumer is built. Refused: `enable.auto.commit`, "
        "`enable.auto.offset.store` and `enable.partition.eof` true, an `auto.offset.reset` other than `error`, an "
        "`isolation.level` other than the primary's, the application's own `group.id`. |"
    )
    return "\n".join(rows)


# -- command line ---------------------------------------------------------------------------------


@contextmanager
def _without_cli_env() -> Iterator[None]:
    saved = {name: os.environ.pop(name) for name in _CLI_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def cli_parser() -> argparse.ArgumentParser:
    """The parser ``fastrecover`` runs, built as a machine without the CLI's environment variables sees it."""
    with _without_cli_env():
        return cli.build_parser()


def _subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, argparse.ArgumentParser, str]]:
    out: list[tuple[str, argparse.ArgumentParser, str]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                out.append((name, sub, helps.get(name, "")))
    return out


def cli_commands() -> set[str]:
    """Every runnable command, e.g. ``db upgrade``, ``status`` (a group such as ``db`` is not one)."""

    def walk(prefix: str, parser: argparse.ArgumentParser) -> Iterator[str]:
        subs = _subcommands(parser)
        if prefix and not subs:
            yield prefix
        for name, sub, _ in subs:
            yield from walk(f"{prefix} {name}".strip(), sub)

    return set(walk("", cli_parser()))


def cli_options(command: str) -> set[str]:
    """The option strings (``--store-url``, ``-h``, ...) of one command."""
    parser = cli_parser()
    for word in command.split():
        parser = dict((name, sub) for name, sub, _ in _subcommands(parser))[word]
    return {s for a in parser._actions for s in a.option_strings}


def _option_row(action: argparse.Action) -> str:
    flags = ", ".join(f"`{s}`" for s in action.option_strings)
    if action.metavar and action.nargs != 0:
        flags += f" `{action.metavar}`"
    elif action.nargs != 0 and action.option_strings:
        flags += f" `{action.dest.upper()}`"
    default = ""
    if action.required:
        default = "required"
    elif action.default not in (None, False, argparse.SUPPRESS) and action.nargs != 0:
        default = f"`{action.default}`"
    return f"| {flags} | {default} | {_cell(action.help or '')} |"


def _command_section(path: str, parser: argparse.ArgumentParser, help_text: str) -> list[str]:
    lines = [f"### `fastrecover {path}`", ""]
    if help_text:
        lines += [help_text[0].upper() + help_text[1:] + ".", ""]
    usage = " ".join(parser.format_usage().split())
    lines += ["```text", usage.removeprefix("usage: "), "```", ""]
    positionals = [a for a in parser._actions if not a.option_strings and a.help != argparse.SUPPRESS]
    options = [a for a in parser._actions if a.option_strings and a.help != argparse.SUPPRESS]
    rows = [_option_row(a) for a in options if "-h" not in a.option_strings]
    rows += [f"| `{a.dest}` (positional) | | {_cell(a.help or '')} |" for a in positionals]
    if rows:
        lines += ["| option | default | meaning |", "| --- | --- | --- |", *rows, ""]
    return lines


def cli_table() -> str:
    """Every command of ``fastrecover``, with its usage line and its options."""
    parser = cli_parser()
    lines = ["### `fastrecover` (global options)", ""]
    lines += ["| option | default | meaning |", "| --- | --- | --- |"]
    lines += [_option_row(a) for a in parser._actions if a.option_strings and "-h" not in a.option_strings]
    lines.append("")

    def walk(prefix: str, parser: argparse.ArgumentParser) -> Iterator[list[str]]:
        for name, sub, help_text in _subcommands(parser):
            path = f"{prefix} {name}".strip()
            if _subcommands(sub):
                yield from walk(path, sub)
            else:
                yield _command_section(path, sub, help_text)

    for section in walk("", parser):
        lines += section
    return "\n".join(lines).rstrip()


# -- Spark options --------------------------------------------------------------------------------


def spark_options() -> set[str]:
    from fastrecover.spark.options import OPTION_DOCS

    return set(OPTION_DOCS)


def spark_options_table() -> str:
    from fastrecover.spark.options import OPTION_DOCS

    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{name}` | {_cell(default)} | {_cell(doc)} |" for name, (default, doc) in OPTION_DOCS.items()]
    return "\n".join(rows)


def spark_kafka_keys_table() -> str:
    """The ``kafka.*`` client properties the Spark sources refuse, from ``fastrecover.spark.client_conf``."""
    from fastrecover.spark.client_conf import DANGEROUS_KAFKA_KEYS, OWNED_KAFKA_KEYS

    rows = ["| option | why it is refused |", "| --- | --- |"]
    rows += [
        f"| `kafka.{key}` | the source sets it itself: it never joins a group nor commits, and a missing offset "
        "is an error, never a silent reset |"
        for key in sorted(OWNED_KAFKA_KEYS)
    ]
    rows += [
        f"| `kafka.{key}` | it makes the client load code or run a command |" for key in sorted(DANGEROUS_KAFKA_KEYS)
    ]
    return "\n".join(rows)


# -- the markers ----------------------------------------------------------------------------------

#: marker name -> table builder
TABLES: dict[str, Callable[[], str]] = {
    "config-keys": config_keys_table,
    "cli": cli_table,
    "spark-options": spark_options_table,
    "spark-kafka-keys": spark_kafka_keys_table,
}

MARKER = re.compile(r"^<!-- reference:([a-z-]+) -->$", re.MULTILINE)


def expand(markdown: str) -> str:
    """``markdown`` with every reference marker replaced by its table; an unknown marker is an error."""

    def table(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"unknown reference marker {name!r}; known: {', '.join(sorted(TABLES))}")
        return TABLES[name]()

    return MARKER.sub(table, markdown)
