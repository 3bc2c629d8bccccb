"""The ``fastrecover`` command line: store administration and inspection.

Adding a command: write ``_add_<name>_parser(subparsers)`` that registers its
arguments and ``set_defaults(func=_cmd_<name>)``, write ``_cmd_<name>(args) ->
int``, and call the former from :func:`build_parser`.  Commands raise
FastRecoverError for anything the user can fix; :func:`main` prints those as
one line on stderr with exit code 2 instead of a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from fastrecover import __version__, status
from fastrecover.config import MIRROR_KEY, parse_mirror_key
from fastrecover.errors import ConfigError, FastRecoverError
from fastrecover.secrets import mask_url
from fastrecover.store import HEAD_REVISION, open_store, upgrade
from fastrecover.store.models import NAME_MAX
from fastrecover.tables import printable
from fastrecover.tokens import Token

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
STORE_URL_ENV = "FASTRECOVER_STORE_URL"

Command = Callable[[argparse.Namespace], int]


def _name(what: str) -> Callable[[str], str]:
    """argparse type for a group/topic name: non-empty, at most NAME_MAX characters (the store's column)."""

    def parse(value: str) -> str:
        if not value or len(value) > NAME_MAX:
            raise argparse.ArgumentTypeError(
                f"{what} must be 1 to {NAME_MAX} characters, got {len(value)}: {printable(value[:40])!r}"
            )
        return value

    return parse


def _store_url(value: str) -> str:
    """argparse type: an SQLAlchemy URL; the error never repeats the password."""
    from fastrecover.store.sql import validate_url

    try:
        validate_url(value)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def _add_store_url(parser: argparse.ArgumentParser) -> None:
    default = os.environ.get(STORE_URL_ENV)
    parser.add_argument(
        "--store-url",
        default=default,
        required=default is None,
        type=_store_url,
        metavar="URL",
        help=f"SQLAlchemy URL of the range store, e.g. sqlite:///fastrecover.db or "
        f"postgresql+psycopg://user@host/db (default: ${STORE_URL_ENV})",
    )


# -- db -----------------------------------------------------------------------


def _add_db_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    db = subparsers.add_parser("db", help="manage the range-store schema")
    db_sub = db.add_subparsers(dest="db_command", metavar="DB_COMMAND", required=True)
    up = db_sub.add_parser("upgrade", help="create or migrate the store schema to this version's revision")
    _add_store_url(up)
    up.set_defaults(func=_cmd_db_upgrade)


def _cmd_db_upgrade(args: argparse.Namespace) -> int:
    revision = upgrade(args.store_url)
    head = " (head)" if revision == HEAD_REVISION else ""
    print(f"range store {mask_url(args.store_url)} is at schema revision {revision}{head}")
    return EXIT_OK


# -- status -------------------------------------------------------------------


def _add_status_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("status", help="show the backfill ranges recorded in the store")
    _add_store_url(parser)
    parser.add_argument("--group", type=_name("--group"), help="only this consumer group")
    parser.add_argument("--all", action="store_true", help="include finished (done) ranges")
    parser.add_argument(
        "--watch",
        action="store_true",
        help="refresh the table until Ctrl-C, with a progress bar and an estimated time left per open range "
        "(redrawn in place on a terminal; successive tables otherwise)",
    )
    parser.add_argument(
        "--interval", type=_interval, default=2.0, metavar="S", help="seconds between --watch refreshes (default 2)"
    )
    parser.set_defaults(func=_cmd_status)


def _interval(value: str) -> float:
    """argparse type for --interval: seconds, from 0.1 to a day."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0.1 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"--interval must be 0.1 to 86400 seconds, got {printable(value[:40])!r}")
    return seconds


def _cmd_status(args: argparse.Namespace) -> int:
    scope = f" of group {printable(args.group)!r}" if args.group else ""
    # read-only: inspecting must work on a file or directory we may not write, and must not change it
    with open_store(args.store_url, create=False, read_only=True) as store:

        def fetch() -> list[Token]:
            return store.ranges(args.group, include_done=args.all, skip_corrupt=True)

        if args.watch:
            status.watch(
                fetch,
                interval=args.interval,
                out=sys.stdout,
                tty=sys.stdout.isatty(),
                title=f"fastrecover status {store.url}",
                include_done=args.all,
                scope=scope,
            )
            return EXIT_OK  # Ctrl-C ends a watch normally
        tokens = fetch()
    if not tokens:
        print(f"no {'ranges' if args.all else 'open ranges'}{scope} in {store.url}")
        return EXIT_OK
    print(status.format_status(tokens))
    print("\n" + status.summary(tokens, include_done=args.all, scope=scope))
    return EXIT_OK


# -- tools (demo, chaos, bench) ---------------------------------------------------
#
# These commands live in the separate fastrecover-tools distribution (tools/ in the
# repository), so the runtime library ships none of their code. Without it the
# commands still parse, and running one says in one line what to install.

TOOLS_MISSING = (
    "`fastrecover {command}` needs the fastrecover-tools package: pip install fastrecover-tools "
    "(from a checkout of the repository: pip install -e tools)"
)


def _tools_module(name: str) -> ModuleType | None:
    """``fastrecover_tools.<name>``, or None when fastrecover-tools is not installed."""
    try:
        return importlib.import_module(f"fastrecover_tools.{name}")
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == "fastrecover_tools" or exc.name.startswith("fastrecover_tools.")):
            return None
        raise


def _add_missing_tools_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser], command: str, help_text: str
) -> None:
    # no option prefix: every argument, even --help, lands in `rest`, so the error below is what the user sees
    parser = subparsers.add_parser(
        command, help=f"{help_text} (needs fastrecover-tools)", add_help=False, prefix_chars="\0"
    )
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    parser.set_defaults(func=lambda args: _tools_missing(command))


def _tools_missing(command: str) -> int:
    raise ConfigError(TOOLS_MISSING.format(command=command))


# -- demo ----------------------------------------------------------------------


_DEMO_HELP = (
    "the KIP's crash/restart story, plain consumer vs parallel rebalance: time to fresh data, time to catch up, "
    "records lost and duplicated, and a latency plot"
)


def _add_broker_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--broker-timeout",
        type=float,
        default=15.0,
        help="seconds to wait for the given broker to answer before giving up (default 15)",
    )


def _add_tools_parser(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    module: str,
    help_text: str,
    func: Command,
    *,
    broker_timeout: bool,
) -> None:
    """A command whose options and work live in ``fastrecover_tools.<module>`` (loaded only here)."""
    command = _tools_module(module)
    if command is None:
        _add_missing_tools_parser(subparsers, name, help_text)
        return
    parser = subparsers.add_parser(name, help=help_text)
    command.add_arguments(parser)
    if broker_timeout:
        _add_broker_timeout(parser)
    parser.set_defaults(func=func)


def _require_broker(bootstrap: str | None, timeout_s: float) -> None:
    """One-line error, after at most ``timeout_s``, when a given broker does not answer."""
    if not bootstrap:
        return
    from fastrecover.rollback import admin_client, check_broker

    check_broker(admin_client(bootstrap), bootstrap, timeout_s)


def _cmd_demo(args: argparse.Namespace) -> int:
    command = _tools_module("demo")
    if command is None:
        return _tools_missing("demo")
    _require_broker(args.bootstrap_servers or os.environ.get("FASTRECOVER_BOOTSTRAP"), args.broker_timeout)
    return int(command.run(args))


# -- chaos ---------------------------------------------------------------------


_CHAOS_HELP = "fault campaign: SIGKILL and restart consumers under load, then prove nothing was lost"


def _cmd_chaos(args: argparse.Namespace) -> int:
    command = _tools_module("chaos.command")
    if command is None:
        return _tools_missing("chaos")

    if args.store_url:
        from fastrecover.store.sql import validate_url

        validate_url(args.store_url)  # ConfigError: one line, password masked
    _require_broker(args.bootstrap_servers or os.environ.get("FASTRECOVER_BOOTSTRAP"), args.broker_timeout)
    result: int = command.run(args)
    return result


# -- rollback ------------------------------------------------------------------


def _add_rollback_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    rb = subparsers.add_parser(
        "rollback",
        help="the way back to plain consumers: move the group's Kafka offsets back to its lowest unfinished "
        "offsets, then delete its open ranges",
    )
    rb.add_argument("--group", required=True, type=_name("--group"), help="the consumer group")
    _add_store_url(rb)
    rb.add_argument(
        "--bootstrap-servers",
        default=os.environ.get("FASTRECOVER_BOOTSTRAP"),
        required=not os.environ.get("FASTRECOVER_BOOTSTRAP"),
        help="Kafka bootstrap servers (default: $FASTRECOVER_BOOTSTRAP)",
    )
    rb.add_argument(
        "--command-config",
        type=argparse.FileType("r", encoding="utf-8"),
        metavar="FILE",
        help="librdkafka properties for the admin client, one key=value a line (security settings: kept out of "
        f"argv); {MIRROR_KEY}=... there is the consumers' mirror key",
    )
    rb.add_argument("--dry-run", action="store_true", help="show what would move; change nothing")
    rb.add_argument("--timeout", type=float, default=15.0, help="seconds per broker request (default 15)")
    rb.set_defaults(func=_cmd_rollback)


def _cmd_rollback(args: argparse.Namespace) -> int:
    from fastrecover import rollback as rb

    extra: dict[str, str] = {}
    if args.command_config:
        with args.command_config as handle:
            extra = rb.read_properties(handle, handle.name)
    # the consumers' mirror key, if they sign the mirror: read from the file, never from argv
    raw_key = extra.pop(MIRROR_KEY, None)
    mirror_key = parse_mirror_key(raw_key) if raw_key is not None else None
    admin = rb.admin_client(args.bootstrap_servers, extra, verbose=args.verbose >= 2)
    rb.check_broker(admin, args.bootstrap_servers, args.timeout)
    rb.ensure_group_empty(admin, args.group, args.bootstrap_servers, args.timeout)
    group = printable(args.group)
    with open_store(args.store_url, create=False) as store:
        plans, errors, deleted = rb.roll_back(
            admin,
            store,
            args.group,
            bootstrap=args.bootstrap_servers,
            timeout_s=args.timeout,
            dry_run=args.dry_run,
            mirror_key=mirror_key,
        )
    if not plans:
        print(f"group {group!r} has no open ranges in {store.url}: nothing to roll back")
        return EXIT_OK
    print(rb.format_rollback(plans, errors, dry_run=args.dry_run))
    if args.dry_run:
        print(f"\ndry run: nothing changed for group {group!r}")
        return EXIT_OK
    print(
        f"\ngroup {group!r}: {sum(1 for p in plans if p.target is not None and (p.topic, p.partition) not in errors)}"
        f" partition(s) moved back, {deleted} open range(s) deleted; plain consumers of the group now re-read "
        "every unfinished record"
    )
    if errors:
        print(
            f"fastrecover: error: {len(errors)} partition(s) could not be moved; their open ranges were kept",
            file=sys.stderr,
        )
        return EXIT_FAILED
    return EXIT_OK


# -- bench ---------------------------------------------------------------------


_BENCH_HELP = "benchmarks against the plain consumer: time to fresh data, drain, steady state, store, memory"


def _cmd_bench(args: argparse.Namespace) -> int:
    command = _tools_module("bench.command")
    result: int = command.run(args) if command is not None else _tools_missing("bench")
    return result


# -- entry point --------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``fastrecover`` command line; the documentation's command reference is generated from it."""
    parser = argparse.ArgumentParser(
        prog="fastrecover",
        description="KIP-333 parallel rebalance for confluent-kafka: demo, range-store tools.",
    )
    parser.add_argument("--version", action="version", version=f"fastrecover {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv: debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_db_parser(subparsers)
    _add_status_parser(subparsers)
    _add_tools_parser(subparsers, "demo", "demo", _DEMO_HELP, _cmd_demo, broker_timeout=True)
    _add_tools_parser(subparsers, "chaos", "chaos.command", _CHAOS_HELP, _cmd_chaos, broker_timeout=True)
    _add_tools_parser(subparsers, "bench", "bench.command", _BENCH_HELP, _cmd_bench, broker_timeout=False)
    _add_rollback_parser(subparsers)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def _one_line(text: str) -> str:
    return printable(" ".join(text.split()))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code (0 ok, 2 usage or fastrecover error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Any = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return EXIT_USAGE
    _configure_logging(args.verbose)
    command: Command = func
    try:
        return command(args)
    except FastRecoverError as exc:
        print(f"fastrecover: error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("fastrecover: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
