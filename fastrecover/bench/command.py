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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from fastrecover.bench.run import SCENARIOS

    parser.add_argument(
        "--bootstrap-servers",
        help="use this Kafka (default: $FASTRECOVER_BOOTSTRAP, a "
        "container when Docker answers, else a local Apache Kafka from Maven Central jars)",
    )
    parser.add_argument(
        "--lags",
        type=_ints,
        default=[10_000, 100_000, 1_000_000],
        help="lags in records for time-to-fresh and drain (default 10000,100000,1000000)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median, min, max); default 3")
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {','.join(SCENARIOS)} (default: all)"
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
        f"there and dropped (default ${PG_URL_ENV}; without it PostgreSQL is skipped)",
    )
    parser.add_argument(
        "--memory-lag", type=int, default=1_000_000, help="lag backfilled in the memory scenario (default 1000000)"
    )
    parser.add_argument(
        "--steady-records", type=int, default=500_000, help="records read per steady-state run (default 500000)"
    )
    parser.add_argument(
        "--steady-repeats",
        type=int,
        default=5,
        help="repeats of the steady-state scenario, which is short and noisy (default 5)",
    )
    parser.add_argument(
        "--store-commits",
        type=int,
        default=2000,
        help="per-message commits per store run (default 2000; batched runs do a quarter)",
    )
    parser.add_argument(
        "--spark",
        action="store_true",
        help="also run the Spark source benchmark (fastrecover.spark.bench; slow, needs pyspark)",
    )


def options_from_args(args: argparse.Namespace, argv: list[str] | None = None) -> object:
    from fastrecover.bench.run import SCENARIOS, BenchOptions

    only = {s.strip() for s in str(args.only).split(",") if s.strip()}
    unknown = only - set(SCENARIOS)
    if unknown:
        raise ConfigError(
            f"--only: unknown scenario(s) {', '.join(sorted(unknown))}; choose from {', '.join(SCENARIOS)}"
        )
    if args.repeats < 1 or args.steady_repeats < 1:
        raise ConfigError("--repeats and --steady-repeats must be at least 1")
    words = ["fastrecover", *(sys.argv[1:] if argv is None else argv)]
    return BenchOptions(
        bootstrap=args.bootstrap_servers,
        lags=list(args.lags),
        repeats=args.repeats,
        only=only,
        out=args.out,
        pg_url=args.pg_url,
        doc=Path(args.doc) if args.doc else None,
        spark=args.spark,
        memory_lag=args.memory_lag,
        steady_records=args.steady_records,
        steady_repeats=args.steady_repeats,
        store_commits=args.store_commits,
        store_batches=max(1, args.store_commits // 4),
        command=shlex.join(words),
    )


def run(args: argparse.Namespace) -> int:
    from fastrecover.bench.run import BenchOptions, run_bench

    opts = options_from_args(args)
    assert isinstance(opts, BenchOptions)
    run_bench(opts)
    return 0
