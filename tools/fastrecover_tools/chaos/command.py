"""``fastrecover chaos``: the long fault campaign from the command line, ending with the checker's table."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastrecover.secrets import mask_url
from fastrecover_tools.testing.worker import APIS, STALL_POINTS

#: the classic group's assignors `--assignment-strategy` offers (librdkafka's names)
ASSIGNMENT_STRATEGIES = ("range", "roundrobin", "cooperative-sticky")

log = logging.getLogger("fastrecover_tools.chaos")

EXIT_PASS = 0
EXIT_FAIL = 1


def _pair(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected MIN,MAX seconds, got {text!r}") from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"need 0 <= MIN <= MAX, got {text!r}")
    return low, high


def _names(choices: tuple[str, ...]) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(choices)}")
        return names

    return parse


def _operator_actions(text: str) -> list[str]:
    from fastrecover_tools.chaos.operator import ACTIONS

    return [] if text.strip() == "none" else _names(ACTIONS)(text)


def add_arguments(p: argparse.ArgumentParser) -> None:
    from fastrecover_tools.chaos.driver import COMMIT_MODES, GROUP_PROTOCOLS
    from fastrecover_tools.chaos.operator import ACTIONS

    p.add_argument(
        "--bootstrap-servers",
        help="Kafka to use (default: $FASTRECOVER_BOOTSTRAP, else a broker started for the run, as the tests do)",
    )
    p.add_argument("--store-url", help="range store (default: a SQLite file in the work directory)")
    p.add_argument("--workdir", type=Path, help="ledgers, logs and the producer log (default: a new temp dir)")
    p.add_argument("--cycles", type=int, default=100, help="SIGKILLs before the drain (default 100)")
    p.add_argument("--members", type=int, default=3, help="consumer processes in the group (default 3)")
    p.add_argument("--topics", type=int, default=3)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--rate", type=float, default=300.0, help="records produced per second (default 300)")
    p.add_argument(
        "--commit-modes",
        type=_names(COMMIT_MODES),
        default=list(COMMIT_MODES),
        help="commit styles drawn per incarnation (default: message,message-async,store,sync,async,auto)",
    )
    p.add_argument(
        "--apis",
        type=_names(APIS),
        default=list(APIS),
        help="read calls drawn per incarnation: consume (batches of 100), poll (a record a call) (default: both)",
    )
    p.add_argument("--commit-every", type=int, default=50, help="records between sync/async commits")
    p.add_argument("--min-offsets", type=int, default=20, help="fastrecover.backfill.min.offsets")
    p.add_argument("--session-ms", type=int, default=3000)
    p.add_argument("--no-static", action="store_true", help="dynamic membership (no group.instance.id)")
    p.add_argument(
        "--group-protocol",
        choices=GROUP_PROTOCOLS,
        default="classic",
        help="the members' group.protocol (default classic). With consumer (KIP-848) the broker's "
        "group.consumer.session.timeout.ms, not --session-ms, decides when a dead member's partitions move: "
        "brokers this project starts set 3 s, Kafka's default is 45 s",
    )
    p.add_argument(
        "--assignment-strategy",
        choices=ASSIGNMENT_STRATEGIES,
        default=None,
        help="the members' partition.assignment.strategy in a classic group (default: librdkafka's "
        "range,roundrobin); cooperative-sticky moves only the partitions that change owner, incrementally",
    )
    p.add_argument(
        "--up",
        type=_pair,
        default=(1.0, 4.0),
        metavar="MIN,MAX",
        help="seconds an incarnation runs before its SIGKILL (default 1,4)",
    )
    p.add_argument(
        "--down",
        type=_pair,
        default=(0.0, 3.0),
        metavar="MIN,MAX",
        help="seconds a killed member stays down (default 0,3)",
    )
    p.add_argument(
        "--stall-share",
        type=float,
        default=0.3,
        help="share of incarnations killed at a stall point instead of a random time (default 0.3)",
    )
    p.add_argument(
        "--stall-points",
        type=_names(STALL_POINTS),
        default=list(STALL_POINTS),
        help=f"stall points to draw from (default: {','.join(STALL_POINTS)})",
    )
    p.add_argument(
        "--fail-child-share",
        type=float,
        default=0.1,
        help="share of incarnations whose child thread raises mid-range (default 0.1)",
    )
    p.add_argument(
        "--freeze-share",
        type=float,
        default=0.2,
        help="share of uptimes that end in a freeze (SIGSTOP, then SIGCONT: the member comes back as a zombie) "
        "instead of a kill (default 0.2)",
    )
    p.add_argument(
        "--freeze",
        type=_pair,
        default=(2.0, 8.0),
        metavar="MIN,MAX",
        help="seconds a frozen member stays stopped; beyond --session-ms its partitions move on without it "
        "(default 2,8)",
    )
    p.add_argument(
        "--net-freeze-share",
        type=float,
        default=None,
        help="share of the other uptimes that end in a frozen network: the member's own proxy to Kafka stops "
        "the bytes for a --freeze time while the process runs on and reaches its store (default 0.2 when this "
        "command starts the broker; a given broker cannot route a member through a proxy, so 0 there)",
    )
    p.add_argument(
        "--operator-actions",
        type=_operator_actions,
        default=list(ACTIONS),
        help=f"operator actions mixed into the kill schedule, or none (default: all of {','.join(ACTIONS)})",
    )
    p.add_argument(
        "--operator-every",
        type=int,
        default=10,
        help="one operator action every this many kills (default 10)",
    )
    p.add_argument(
        "--replay-share",
        type=float,
        default=0.5,
        help="share of incarnations whose store opens only when a recovery needs it: half of them keep the "
        "library's fastrecover.recovery.replay.max.offsets (a small lag is replayed while the store opens), half "
        "set it to 50 (a larger lag is replayed until the store is open, then jumps late); the others open it at "
        "once (default 0.5)",
    )
    p.add_argument("--work-us", type=int, default=0, help="simulated processing time per record")
    p.add_argument("--seed", type=int, help="random seed (default: random)")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="seconds the final drain may take")
    p.add_argument("--json", type=Path, help="also write the verdict as JSON here")


#: --net-freeze-share when the command starts the broker itself
DEFAULT_NET_FREEZE_SHARE = 0.2


@contextmanager
def _bootstrap(given: str | None, members: int, net_freeze_share: float | None) -> Iterator[tuple[str, list[Any]]]:
    """The broker, and a proxy to it per member when networks are to freeze (a broker of our own)."""
    servers = given or os.environ.get("FASTRECOVER_BOOTSTRAP")
    if servers:
        if net_freeze_share:
            raise SystemExit(
                f"--net-freeze-share {net_freeze_share:g} needs a broker this command starts (each member reaches "
                f"it through a listener and proxy of its own); drop it, or --bootstrap-servers and "
                f"$FASTRECOVER_BOOTSTRAP ({servers})"
            )
        yield servers, []
        return
    if net_freeze_share == 0:
        from fastrecover_tools.testing.broker import select_broker

        with select_broker() as broker:
            yield broker.bootstrap, []
        return
    from fastrecover_tools.testing.broker import LocalJarBroker
    from fastrecover_tools.testing.proxy import proxied_listeners

    proxies, listeners = proxied_listeners(members)
    try:
        with LocalJarBroker(extra_listeners=listeners) as local:
            yield local.bootstrap, proxies
    finally:
        for proxy in proxies:
            proxy.close()


def run(args: argparse.Namespace) -> int:
    from fastrecover_tools.chaos.driver import ChaosConfig, ChaosDriver
    from fastrecover_tools.chaos.report import dumps, format_result

    if args.assignment_strategy and args.group_protocol != "classic":
        raise SystemExit(
            f"--assignment-strategy {args.assignment_strategy} is a classic group's setting; with "
            f"--group-protocol {args.group_protocol} the broker assigns the partitions"
        )
    strategy = []
    if args.assignment_strategy:
        strategy = ["--set", f"partition.assignment.strategy={args.assignment_strategy}"]
    workdir: Path = args.workdir or Path(tempfile.mkdtemp(prefix="fastrecover-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_url = args.store_url or f"sqlite:///{workdir / 'ranges.db'}"
    with _bootstrap(args.bootstrap_servers, args.members, args.net_freeze_share) as (servers, networks):
        net_share = args.net_freeze_share if args.net_freeze_share is not None else DEFAULT_NET_FREEZE_SHARE
        config = ChaosConfig(
            bootstrap=servers,
            store_url=store_url,
            workdir=workdir,
            cycles=args.cycles,
            members=args.members,
            topics=args.topics,
            partitions=args.partitions,
            rate=args.rate,
            commit_modes=args.commit_modes,
            apis=args.apis,
            commit_every=args.commit_every,
            min_offsets=args.min_offsets,
            session_ms=args.session_ms,
            static=not args.no_static,
            up_s=args.up,
            down_s=args.down,
            stall_share=args.stall_share,
            stall_points=args.stall_points,
            fail_child_share=args.fail_child_share,
            work_us=args.work_us,
            seed=args.seed,
            drain_timeout_s=args.drain_timeout,
            group_protocol=args.group_protocol,
            worker_args=strategy,
            operator_actions=args.operator_actions,
            operator_every=args.operator_every,
            replay_share=args.replay_share,
            freeze_share=args.freeze_share,
            freeze_s=args.freeze,
            net_freeze_share=net_share if networks else 0.0,
        )
        print(
            f"chaos: {args.members} members ({args.group_protocol} group"
            f"{', ' + args.assignment_strategy if args.assignment_strategy else ''}), {args.cycles} kill cycles, "
            f"{args.topics} topics x {args.partitions} partitions at {args.rate:g} records/s; "
            f"broker {servers}; store {mask_url(store_url)}; "
            f"work dir {workdir}",
            flush=True,
        )
        result = ChaosDriver(config, networks=networks).run()
    print(format_result(result), flush=True)
    if args.json:
        args.json.write_text(dumps(result) + "\n", encoding="utf-8")
    if not result.verdict.ok:
        print(f"evidence kept in {workdir}", file=sys.stderr)
    return EXIT_PASS if result.verdict.ok else EXIT_FAIL
