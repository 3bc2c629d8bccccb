"""What an idle consumer costs: the caller thread's CPU while ``poll()``/``consume()`` find nothing.

``python -m fastrecover_tools.bench.idle``: plain and mode-on consumers, interleaved, each
subscribed to a topic nobody writes to.  A run waits for its assignment, lets the consumer settle
(past the store's deferred open and the slices that follow an assignment), then counts the CPU the
calling thread spends over a window of back-to-back calls with a 1 s timeout.  A mode-on consumer
waits in slices to look for a backlog a recovery may have handed the child
(``fastrecover.steady``), so it wakes more often than confluent_kafka's own wait; this measures
what that costs.  One process runs every consumer, one at a time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastrecover_tools.bench.report import Stat, markdown_table, paired_ratios
from fastrecover_tools.bench.steady_instructions import rotated
from fastrecover_tools.quickstart import QUICKSTART

MODES = ("plain", "fastrecover")
APIS = ("poll", "consume")
#: the timeout of every call in the window: longer than any slice, as an idle service loop's
CALL_TIMEOUT_S = 1.0
ASSIGN_TIMEOUT_S = 60.0


def cells_of(runs: Sequence[dict[str, Any]], apis: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per call, each mode's CPU per second over the repeats and fastrecover / plain paired by repeat."""
    cells: dict[str, dict[str, Any]] = {}
    for api in apis:
        by_repeat: dict[int, dict[str, float]] = {}
        for run in runs:
            if run["api"] == api:
                by_repeat.setdefault(run["repeat"], {})[run["mode"]] = run["cpu_ms_per_s"]
        pairs = [by_repeat[rep] for rep in sorted(by_repeat)]
        cells[api] = {mode: Stat.of(p.get(mode) for p in pairs).to_dict() for mode in MODES}
        cells[api]["ratio"] = paired_ratios(
            [p.get("fastrecover") for p in pairs], [p.get("plain") for p in pairs]
        ).to_dict()
    return cells


def _consumer(mode: str, bootstrap: str, group: str, store_dir: Path) -> Any:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "group.instance.id": f"{group}-0",
        "auto.offset.reset": "latest",
        **QUICKSTART,
    }
    if mode == "plain":
        from confluent_kafka import Consumer

        return Consumer(conf)
    from fastrecover import Consumer as ModeOn

    conf.update({"enable.parallel.rebalance": True, "fastrecover.store.url": f"sqlite:///{store_dir / group}.db"})
    return ModeOn(conf)


def idle_run(
    mode: str, api: str, bootstrap: str, topic: str, settle_s: float, window_s: float, store_dir: Path
) -> dict[str, Any]:
    """One consumer's idle window: its caller thread's CPU per second of waiting, and its calls."""
    consumer = _consumer(mode, bootstrap, f"bench-idle-{mode}-{uuid.uuid4().hex[:8]}", store_dir)

    def call() -> int:
        if api == "poll":
            return 0 if consumer.poll(CALL_TIMEOUT_S) is None else 1
        return len(consumer.consume(500, CALL_TIMEOUT_S))

    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + ASSIGN_TIMEOUT_S
        while not consumer.assignment():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{mode}: no assignment within {ASSIGN_TIMEOUT_S:g} s")
            call()
        settled = time.monotonic() + settle_s
        while time.monotonic() < settled:
            call()
        received = calls = 0
        cpu0, wall0 = time.thread_time(), time.monotonic()
        while time.monotonic() - wall0 < window_s:
            received += call()
            calls += 1
        wall = time.monotonic() - wall0
        cpu = time.thread_time() - cpu0
    finally:
        consumer.close()
    return {"cpu_ms_per_s": cpu * 1000 / wall, "window_s": wall, "calls": calls, "records": received}


def run(bootstrap: str, repeats: int, settle_s: float, window_s: float, apis: Sequence[str]) -> dict[str, Any]:
    from fastrecover_tools.bench.run import machine_info
    from fastrecover_tools.testing.broker import create_topic, delete_topic

    topic = f"bench-idle-{uuid.uuid4().hex[:6]}"
    create_topic(bootstrap, topic, 3)
    runs: list[dict[str, Any]] = []
    started = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="fastrecover-idle-") as tmp:
            for rep in range(repeats):
                for index, api in enumerate(apis):
                    for mode in rotated(MODES, rep + index):
                        found = idle_run(mode, api, bootstrap, topic, settle_s, window_s, Path(tmp))
                        runs.append({"repeat": rep, "mode": mode, "api": api, **found})
                        print(
                            f"[idle] repeat {rep + 1}/{repeats} {api:8s} {mode:12s}: "
                            f"{found['cpu_ms_per_s']:.2f} ms of CPU a second ({found['calls']} calls)",
                            file=sys.stderr,
                            flush=True,
                        )
    finally:
        delete_topic(bootstrap, topic)
    return {
        "command": " ".join(["python -m fastrecover_tools.bench.idle", *sys.argv[1:]]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)),
        "machine": machine_info(bootstrap, None),
        "settings": {"settle_s": settle_s, "window_s": window_s, "call_timeout_s": CALL_TIMEOUT_S, **QUICKSTART},
        "cells": cells_of(runs, apis),
        "runs": runs,
    }


def table(result: dict[str, Any]) -> str:
    """The result as a Markdown table: ms of the caller thread's CPU per second idle, medians (min-max)."""
    rows = []
    for api, per in result["cells"].items():
        spelled = f"`poll({CALL_TIMEOUT_S:g})`" if api == "poll" else f"`consume(500, {CALL_TIMEOUT_S:g})`"
        plain, fast, ratio = (Stat.from_dict(per[k]) for k in ("plain", "fastrecover", "ratio"))
        rows.append([spelled, plain.cell(2), fast.cell(2), ratio.cell(1)])
    return markdown_table(["call", "plain (ms/s)", "fastrecover (ms/s)", "fastrecover / plain (paired)"], rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastrecover_tools.bench.idle", description=__doc__.split("\n")[0])
    p.add_argument(
        "--bootstrap-servers", default=os.environ.get("FASTRECOVER_BOOTSTRAP"), help="default: $FASTRECOVER_BOOTSTRAP"
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of every cell, the modes interleaved (default 3)")
    p.add_argument(
        "--settle", type=float, default=7.0, help="seconds between the assignment and the window (default 7)"
    )
    p.add_argument("--window", type=float, default=10.0, help="seconds of idle calls measured (default 10)")
    p.add_argument("--apis", default=",".join(APIS), help="comma-separated, of poll,consume (default: both)")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    args = p.parse_args(argv)
    if not args.bootstrap_servers:
        p.error("no broker: pass --bootstrap-servers or set FASTRECOVER_BOOTSTRAP")
    apis = [a for a in args.apis.split(",") if a]
    unknown = sorted(set(apis) - set(APIS))
    if unknown or args.repeats < 1 or args.window <= 0 or args.settle < 0:
        p.error(
            f"bad options: apis {unknown or apis}, repeats {args.repeats}, window {args.window}, settle {args.settle}"
        )
    result = run(args.bootstrap_servers, args.repeats, args.settle, args.window, apis)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
