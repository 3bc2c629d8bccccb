"""The ``fastrecover`` command line: store administration and inspection.

Adding a command: write ``_add_<name>_parser(subparsers)`` that registers its
arguments and ``set_defaults(func=_cmd_<name>)``, write ``_cmd_<name>(args) ->
int``, and call the former from :func:`_build_parser`.  Commands raise
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

from fastrecover import __version__
from fastrecover.errors import ConfigError, FastRecoverError
from fastrecover.store import HEAD_REVISION, mask_url, open_store, upgrade
from fastrecover.store.models import NAME_MAX
from fastrecover.tokens import Token

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130
STORE_URL_ENV = "FASTRECOVER_STORE_URL"

Command = Callable[[argparse.Namespace], int]


def printable(text: str) -> str:
    """``text`` with control and other non-printable characters escaped (\\x1b, \\n, ...).

    Group, topic and owner names come from whoever wrote the store or Kafka:
    printed as they are, they could move the cursor, recolour or rewrite the
    operator's terminal.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


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
    status = subparsers.add_parser("status", help="show the backfill ranges recorded in the store")
    _add_store_url(status)
    status.add_argument("--group", type=_name("--group"), help="only this consumer group")
    status.add_argument("--all", action="store_true", help="include finished (done) ranges")
    status.set_defaults(func=_cmd_status)


_STATUS_HEADER = (
    "GROUP",
    "TOPIC",
    "PART",
    "ID",
    "RANGE",
    "COMMITTED",
    "PROGRESS",
    "REMAINING",
    "SKIPPED",
    "OWNER",
    "EPOCH",
    "STATE",
)
_RIGHT_ALIGNED = frozenset({"PART", "ID", "COMMITTED", "PROGRESS", "REMAINING", "SKIPPED", "EPOCH"})


def _status_row(token: Token) -> tuple[str, ...]:
    p = token.progress
    size = p.end - p.start
    finished = size - p.remaining
    percent = 100.0 if size == 0 else 100.0 * finished / size
    return (
        printable(token.group),
        printable(token.topic),
        str(token.partition),
        str(token.id),
        f"[{p.start}, {p.end})",
        str(p.committed),
        f"{percent:.1f}%",
        str(p.remaining),
        str(token.skipped),
        printable(token.owner) if token.owner else "-",
        str(token.epoch),
        token.state.value,
    )


def format_status(tokens: Sequence[Token]) -> str:
    """A plain-text table, one line per range, sorted by group/topic/partition/offset."""
    ordered = sorted(tokens, key=lambda t: (t.group, t.topic, t.partition, t.span.start))
    rows = [_status_row(t) for t in ordered]
    widths = [max(len(r[i]) for r in [_STATUS_HEADER, *rows]) for i in range(len(_STATUS_HEADER))]

    def line(cells: Sequence[str]) -> str:
        parts = [
            c.rjust(w) if h in _RIGHT_ALIGNED else c.ljust(w)
            for c, w, h in zip(cells, widths, _STATUS_HEADER, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(_STATUS_HEADER), *(line(r) for r in rows)])


def _cmd_status(args: argparse.Namespace) -> int:
    # read-only: inspecting must work on a file or directory we may not write, and must not change it
    with open_store(args.store_url, create=False, read_only=True) as store:
        tokens = store.ranges(args.group, include_done=args.all, skip_corrupt=True)
    what = "ranges" if args.all else "open ranges"
    scope = f" of group {printable(args.group)!r}" if args.group else ""
    if not tokens:
        print(f"no {what}{scope} in {store.url}")
        return EXIT_OK
    print(format_status(tokens))
    open_tokens = [t for t in tokens if t.is_open]
    remaining = sum(t.progress.remaining for t in open_tokens)
    skipped = sum(t.skipped for t in tokens)
    counts = f"{len(tokens)} {what}{scope}"
    if args.all:
        counts += f" ({len(open_tokens)} open)"
    print(f"\n{counts}: {remaining} records left to backfill, {skipped} skipped (lost to retention)")
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


_DEMO_HELP = "the KIP's crash/restart story: plain consumer vs parallel rebalance, time to fresh data"


def _add_demo_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    if importlib.util.find_spec("fastrecover_tools") is None:
        _add_missing_tools_parser(subparsers, "demo", _DEMO_HELP)
        return
    demo = subparsers.add_parser("demo", help=_DEMO_HELP)
    demo.add_argument(
        "--bootstrap-servers",
        help="use this Kafka (default: $FASTRECOVER_BOOTSTRAP, a "
        "container when Docker answers, else a local Apache Kafka from Maven Central jars)",
    )
    demo.add_argument(
        "--store-url", type=_store_url, help="range store (default: sqlite file fastrecover-demo.db here)"
    )
    demo.add_argument(
        "--broker-timeout",
        type=float,
        default=15.0,
        help="seconds to wait for the given broker to answer before giving up (default 15)",
    )
    demo.add_argument("--rate", type=int, default=3000, help="records produced per second (default 3000)")
    demo.add_argument(
        "--down-seconds",
        type=float,
        default=10.0,
        help="how long the consumer stays dead while the lag builds (default 10)",
    )
    demo.add_argument(
        "--work-us", type=int, default=200, help="simulated processing time per record in microseconds (default 200)"
    )
    demo.add_argument("--partitions", type=int, default=3)
    demo.set_defaults(func=_cmd_demo)


def _require_broker(bootstrap: str | None, timeout_s: float) -> None:
    """One-line error, after at most ``timeout_s``, when a given broker does not answer."""
    if not bootstrap:
        return
    from fastrecover.rollback import admin_client, check_broker

    check_broker(admin_client(bootstrap), bootstrap, timeout_s)


def _cmd_demo(args: argparse.Namespace) -> int:
    demo = _tools_module("demo")
    if demo is None:
        return _tools_missing("demo")

    _require_broker(args.bootstrap_servers or os.environ.get("FASTRECOVER_BOOTSTRAP"), args.broker_timeout)
    demo.main(args.bootstrap_servers, args.store_url, args.rate, args.down_seconds, args.work_us, args.partitions)
    return EXIT_OK


# -- chaos ---------------------------------------------------------------------


_CHAOS_HELP = "fault campaign: SIGKILL and restart consumers under load, then prove nothing was lost"


def _add_chaos_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _tools_module("chaos.command")
    if command is None:
        _add_missing_tools_parser(subparsers, "chaos", _CHAOS_HELP)
        return
    chaos = subparsers.add_parser("chaos", help=_CHAOS_HELP)
    command.add_arguments(chaos)
    chaos.add_argument(
        "--broker-timeout",
        type=float,
        default=15.0,
        help="seconds to wait for the given broker to answer before giving up (default 15)",
    )
    chaos.set_defaults(func=_cmd_chaos)


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
        help="librdkafka properties for the admin client, one key=value a line (security settings: kept out of argv)",
    )
    rb.add_argument("--dry-run", action="store_true", help="show what would move; change nothing")
    rb.add_argument("--timeout", type=float, default=15.0, help="seconds per broker request (default 15)")
    rb.set_defaults(func=_cmd_rollback)


def _read_properties(handle: Any) -> dict[str, str]:
    props: dict[str, str] = {}
    with handle:
        for number, raw in enumerate(handle, 1):
            line = raw.strip()
            if not line or line.startswith(("#", "!")):
                continue
            key, sep, value = line.partition("=")
            if not sep or not key.strip():
                raise ConfigError(f"{handle.name}:{number}: expected key=value")
            props[key.strip()] = value.strip()
    return props


_ROLLBACK_HEADER = ("TOPIC", "PART", "KAFKA OFFSET", "LOWEST UNFINISHED", "NEW OFFSET", "OPEN RANGES", "RESULT")


def format_rollback(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [_ROLLBACK_HEADER, *rows]) for i in range(len(_ROLLBACK_HEADER))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in [_ROLLBACK_HEADER, *rows]
    )


def _cmd_rollback(args: argparse.Namespace) -> int:
    from fastrecover import rollback as rb

    extra = _read_properties(args.command_config) if args.command_config else {}
    admin = rb.admin_client(args.bootstrap_servers, extra, verbose=args.verbose >= 2)
    rb.check_broker(admin, args.bootstrap_servers, args.timeout)
    rb.ensure_group_empty(admin, args.group, args.bootstrap_servers, args.timeout)
    with open_store(args.store_url, create=False) as store:
        tokens = store.open_ranges(args.group)
        partitions = sorted({(t.topic, t.partition) for t in tokens})
        kafka = rb.kafka_offsets(admin, args.group, partitions, args.bootstrap_servers, args.timeout)
        plans = rb.plan_rollback(tokens, kafka)
        group = printable(args.group)
        if not plans:
            print(f"group {group!r} has no open ranges in {store.url}: nothing to roll back")
            return EXIT_OK
        errors: dict[tuple[str, int], str] = {}
        deleted = 0
        if not args.dry_run:
            # the group must still be empty right before the move; Kafka refuses it otherwise anyway
            rb.ensure_group_empty(admin, args.group, args.bootstrap_servers, args.timeout)
            errors = rb.move_offsets(admin, args.group, plans, args.bootstrap_servers, args.timeout)
            safe = [i for p in plans if (p.topic, p.partition) not in errors for i in p.token_ids]
            deleted = store.delete_open(args.group, safe)
    rows = []
    for p in plans:
        error = errors.get((p.topic, p.partition))
        if error:
            result = f"FAILED: {printable(error)}"
        elif args.dry_run:
            result = "would move back" if p.target is not None else "would keep (already lower)"
        else:
            result = "moved back" if p.target is not None else "kept (already lower)"
        rows.append(
            (
                printable(p.topic),
                str(p.partition),
                "-" if p.kafka_before is None else str(p.kafka_before),
                str(p.lowest_unfinished),
                str(p.target if p.target is not None else p.kafka_before),
                ", ".join(f"#{i}" for i in p.token_ids),
                result,
            )
        )
    print(format_rollback(rows))
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


def _add_bench_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = _tools_module("bench.command")
    if command is None:
        _add_missing_tools_parser(subparsers, "bench", _BENCH_HELP)
        return
    bench = subparsers.add_parser("bench", help=_BENCH_HELP)
    command.add_arguments(bench)
    bench.set_defaults(func=_cmd_bench)


def _cmd_bench(args: argparse.Namespace) -> int:
    command = _tools_module("bench.command")
    if command is None:
        return _tools_missing("bench")
    result: int = command.run(args)
    return result


# -- entry point --------------------------------------------------------------


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fastrecover",
        description="KIP-333 parallel rebalance for confluent-kafka: demo, range-store tools.",
    )
    parser.add_argument("--version", action="version", version=f"fastrecover {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging on stderr (-vv: debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_db_parser(subparsers)
    _add_status_parser(subparsers)
    _add_demo_parser(subparsers)
    _add_chaos_parser(subparsers)
    _add_bench_parser(subparsers)
    _add_rollback_parser(subparsers)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")


def _one_line(text: str) -> str:
    return printable(" ".join(text.split()))


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code (0 ok, 2 usage or fastrecover error)."""
    parser = _build_parser()
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
