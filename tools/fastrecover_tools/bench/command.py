"""Arguments and entry of ``fastrecover bench`` (registered in :mod:`fastrecover.cli`)."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from fastrecover.errors import ConfigError

PG_URL_ENV = "FASTRECOVER_PG_URL"


def _ints(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    values = _ints(text)
    if len(values) != 1:
        raise argparse.ArgumentTypeError(f"expected one positive integer, got {text!r}")
    return values[0]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fastrecover_tools.bench.crash import KIP848_HEARTBEAT_MS, KIP848_SESSION_MS, SETUPS
    from fastrecover_tools.bench.patterns import PATTERNS
    from fastrecover_tools.bench.run import FULL, QUICK, SCENARIOS

    parser.add_argument(
        "--bootstrap-servers",
        help="use this Kafka (default: $FASTRECOVER_BOOTSTRAP, a "
        "container when Docker answers, else a local Apache Kafka from Maven Central jars)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke-run sizes (lags {QUICK.lags}, crash lags {QUICK.crash_lags}, {QUICK.steady_records:,} steady "
        "records, 2 repeats): "
        "checks the harness in a few minutes; its ratios mean nothing",
    )
    parser.add_argument(
        "--repeats", type=int, help="runs per restart figure, plain and fastrecover interleaved (default 3; --quick 2)"
    )
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument(
        "--patterns",
        default=",".join(PATTERNS),
        help=f"comma-separated commit patterns of the matrix, of {','.join(PATTERNS)} (default: all)",
    )
    parser.add_argument("--lags", type=_ints, help=f"restart lags of every pattern but msg-sync (default {FULL.lags})")
    parser.add_argument(
        "--ttf-lag",
        type=_positive,
        help=f"the small lag of the time-to-fresh goal, auto-commit only (default {FULL.ttf_lag})",
    )
    parser.add_argument("--sync-lags", type=_ints, help=f"restart lags of msg-sync (default {FULL.sync_lags})")
    parser.add_argument("--work-us", type=int, default=20, help="CPU work per record of the work run (default 20 µs)")
    parser.add_argument("--work-lag", type=_positive, help=f"lag of the work run (default {FULL.work_lag})")
    parser.add_argument(
        "--steady-records", type=_positive, help=f"records per steady-state run (default {FULL.steady_records})"
    )
    parser.add_argument(
        "--steady-repeats", type=_positive, help=f"repeats of every steady-state cell (default {FULL.steady_repeats})"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/benchmarks"),
        help="directory for results.json, bench.png and table.md (default docs/benchmarks)",
    )
    parser.add_argument(
        "--doc",
        default="docs/benchmarks.md",
        help="Markdown file whose bench-table block is refreshed ('' to leave docs alone)",
    )
    parser.add_argument(
        "--pg-url",
        default=os.environ.get(PG_URL_ENV),
        help=f"PostgreSQL server for the store benchmark; a throwaway database is created "
        f"there and dropped (default ${PG_URL_ENV}; without it PostgreSQL is skipped). "
        "Its password is never printed or written",
    )
    parser.add_argument(
        "--store-commits",
        type=_positive,
        help=f"per-message commits per store run (default {FULL.store_commits}; batched runs do a quarter)",
    )
    parser.add_argument(
        "--crash-lags",
        type=_ints,
        help=f"lags of the crash runs: SIGKILL, restart after --crash-down (default {FULL.crash_lags}; "
        "the issue's full set: 1000,10000,100000,1000000,10000000)",
    )
    parser.add_argument(
        "--crash-setups",
        default=",".join(SETUPS),
        help=f"comma-separated consumer settings of the crash runs, of {','.join(SETUPS)} (default: all)",
    )
    parser.add_argument(
        "--crash-down",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="how long a crashed consumer stays down before its restart (default 3)",
    )
    parser.add_argument("--crash-repeats", type=_positive, help="repeats of every crash cell (default: --repeats)")
    parser.add_argument(
        "--crash-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="crash → first fresh record deadline of a crash run, restarts after fatal errors included, "
        "plus lag / 10,000 records/s (default 120)",
    )
    parser.add_argument(
        "--kip848-session-ms",
        type=int,
        default=KIP848_SESSION_MS,
        help=f"consumer.session.timeout.ms set on each group.protocol=consumer group (default {KIP848_SESSION_MS}, "
        "Kafka's default for group.consumer.session.timeout.ms; 0 keeps the broker's)",
    )
    parser.add_argument(
        "--kip848-heartbeat-ms",
        type=int,
        default=KIP848_HEARTBEAT_MS,
        help=f"consumer.heartbeat.interval.ms of those groups (default {KIP848_HEARTBEAT_MS}; 0 keeps the broker's)",
    )
    parser.add_argument(
        "--partition-counts",
        type=_ints,
        help=f"partitions per member of the partitions runs (default {','.join(map(str, FULL.partition_counts))}; "
        f"--quick {','.join(map(str, QUICK.partition_counts))})",
    )
    parser.add_argument(
        "--partition-lag",
        type=_positive,
        help=f"records behind the committed offset on every partition of the partitions runs "
        f"(default {FULL.partition_lag}: above fastrecover.backfill.min.offsets, so each partition gets a range)",
    )
    parser.add_argument(
        "--partition-repeats", type=_positive, help="repeats of every partitions cell (default: --repeats)"
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="DIR",
        help="profile every consumer process (cProfile, DIR/<run>-<pid>.prof) to find where the time goes "
        "(partitions runs: the assign() in on_assign, which is fastrecover's recovery); "
        "a profiled run's figures are distorted: use another --out",
    )
    parser.add_argument(
        "--spark",
        action="store_true",
        help="also run the Spark source benchmark (fastrecover_tools.spark_bench; slow, needs pyspark)",
    )


def _csv(text: str) -> list[str]:
    return [s.strip() for s in str(text).split(",") if s.strip()]


def options_from_args(args: argparse.Namespace, argv: list[str] | None = None) -> object:
    from fastrecover_tools.bench.crash import SETUPS
    from fastrecover_tools.bench.patterns import PATTERNS
    from fastrecover_tools.bench.redact import mask_command, url_secrets
    from fastrecover_tools.bench.run import FULL, QUICK, SCENARIOS, BenchOptions, CrashOptions, Sizes

    only = set(_csv(args.only))
    unknown = only - set(SCENARIOS)
    if unknown:
        raise ConfigError(
            f"--only: unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}"
        )
    patterns = _csv(args.patterns)
    bad = [p for p in patterns if p not in PATTERNS]
    if bad or not patterns:
        raise ConfigError(
            f"--patterns: unknown pattern(s) {', '.join(bad) or '(none)'}; choose from {', '.join(PATTERNS)}"
        )
    setups = _csv(args.crash_setups)
    bad = [s for s in setups if s not in SETUPS]
    if bad or not setups:
        raise ConfigError(
            f"--crash-setups: unknown setting(s) {', '.join(bad) or '(none)'}; choose from {', '.join(SETUPS)}"
        )
    if args.crash_down < 0:
        raise ConfigError(f"--crash-down must be 0 or more, got {args.crash_down}")
    if args.crash_timeout <= 0:
        raise ConfigError(f"--crash-timeout must be positive, got {args.crash_timeout}")
    if args.kip848_session_ms < 0 or args.kip848_heartbeat_ms < 0:
        raise ConfigError("--kip848-session-ms and --kip848-heartbeat-ms must be 0 (the broker's) or more")
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    if repeats < 1:
        raise ConfigError(f"--repeats must be at least 1, got {repeats}")
    if args.work_us < 0:
        raise ConfigError(f"--work-us must be 0 or more, got {args.work_us}")
    if args.profile is not None and (args.doc or args.out == Path("docs/benchmarks")):
        raise ConfigError("--profile distorts the figures: give it --doc '' and an --out of its own")
    base = QUICK if args.quick else FULL
    overrides = {
        "lags": args.lags,
        "ttf_lag": args.ttf_lag,
        "sync_lags": args.sync_lags,
        "work_lag": args.work_lag,
        "steady_records": args.steady_records,
        "steady_repeats": args.steady_repeats,
        "store_commits": args.store_commits,
        "crash_lags": args.crash_lags,
        "partition_counts": args.partition_counts,
        "partition_lag": args.partition_lag,
    }
    sizes = Sizes(**{**vars(base), **{k: v for k, v in overrides.items() if v is not None}})
    words = ["fastrecover", *(sys.argv[1:] if argv is None else argv)]
    secrets = url_secrets(args.pg_url) if args.pg_url else []
    return BenchOptions(
        bootstrap=args.bootstrap_servers,
        sizes=sizes,
        repeats=repeats,
        only=only,
        patterns=patterns,
        work_us=args.work_us,
        out=args.out,
        pg_url=args.pg_url,
        doc=Path(args.doc) if args.doc else None,
        spark=args.spark,
        profile=args.profile,
        crash=CrashOptions(
            setups=setups,
            down_s=args.crash_down,
            repeats=args.crash_repeats,
            timeout_s=args.crash_timeout,
            kip848_session_ms=args.kip848_session_ms,
            kip848_heartbeat_ms=args.kip848_heartbeat_ms,
        ),
        partition_repeats=args.partition_repeats,
        command=shlex.join(mask_command(words)),
        secrets=secrets,
    )


def run(args: argparse.Namespace) -> int:
    from fastrecover_tools.bench.run import BenchOptions, run_bench

    opts = options_from_args(args)
    assert isinstance(opts, BenchOptions)
    run_bench(opts)
    return 0
