"""Instructions the caller's thread executes per record in the steady state, counted by callgrind.

``python -m fastrecover_tools.bench.steady_instructions``: on a shared 2-core virtual machine
the caller's CPU time per record of one and the same consumer varies by 8-30 % from run to run,
so a timing run cannot tell whether a change to the steady path costs 3 %.  The number of
instructions that path executes barely depends on the machine's load, so it is counted instead:
every run is a process under valgrind's callgrind with ``--separate-threads=yes``, and only the
file of thread 1 (the interpreter's main thread, which calls ``poll()``/``consume()``) is read.
librdkafka's own threads and the mode-on consumer's store thread are other threads, other files.

What is compared: a plain ``confluent_kafka.Consumer`` and ``fastrecover.Consumer`` (mode on, no
range open: a new group reading a pre-filled topic from the start; auto-commit, the README
quickstart's pattern) at one or more commits, each in a detached git worktree of its own with its
C extension built from that commit's ``_fastpoll.c`` the way ``hatch_build.py`` builds it.  Each
run waits for the assignment and the first record, zeroes callgrind's counters (a marker call,
see :data:`ZERO_MARKER`), reads ``N`` records and leaves with ``os._exit``; a cell is run at two
record counts and its cost per record is ``(Ir(N2) - Ir(N1)) / (N2 - N1)``, so whatever a run
spends once (the marker, the loop's first and last fetch) cancels.  Variants are interleaved and
every cell is repeated; the median and the spread ``(max - min) / median`` are reported.

The mode-on consumer's tick (its periodic work, every 50 ms of wall clock, in the caller's thread)
is the one part whose count follows time rather than records: under callgrind a second holds about
50 times fewer records, so every record would carry about 50 times its native share of the tick, a
share set by the machine's load.  The worker therefore multiplies the tick period by ``--tick-scale``
(50, about callgrind's slowdown; see :func:`slow_ticks`), which puts about as many records between
two ticks as natively; plain has no tick.  ``auto.commit.interval.ms`` (the cadence of librdkafka's
auto-commit and of the mode's range commits) is stretched by the same factor, for every variant.

What the count shows: the work of the Python layer and the C extension per record, and the part of
librdkafka (queue pops, message destruction) done in the caller's thread, which is the same code
for every variant.  What it does not show: time.  Cache misses, branch mispredictions, lock
contention with librdkafka's threads, and work moved onto other threads do not appear; a change
that trades instructions for memory traffic can count fewer and run slower.  Use it to bound a
steady-path change's cost, next to the timing runs, not instead of them.

How exact it is: the plain consumer repeats within 0.1 %.  A mode-on consumer spreads 1.5-3.5 %
from run to run, and a per-function comparison of two such runs puts most of the difference in
glibc's malloc (``_int_malloc``, ``unlink_chunk``): the heap's history, which the consumer's other
threads (the store's open, the startup import, librdkafka's) shape differently in every run.  A
difference between commits smaller than that spread needs more repeats than the default five.

So each count is also split in two with ``callgrind_annotate``: the *client's* share, the inclusive
cost of confluent_kafka's C poll/consume and of a record's release (:data:`CLIENT_FUNCTIONS`), where
nearly all of that malloc work happens and which is the same code for every variant; and the
*wrapper's* share, the rest of thread 1: fastrecover's Python layer and extension (nothing for
plain) and the benchmark's loop.  The wrapper's count repeats within about 1 %, and what one
variant's wrapper adds per record over another's, as a share of the other's whole count, is the
cost of a change to the steady path that the whole count's spread hides.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastrecover_tools.bench.patterns import PATTERNS, consumer_config, hooks
from fastrecover_tools.bench.report import Stat

PARTITIONS = 3
VALUE_SIZE = 100
PLAIN = "plain"
APIS = ("poll", "consume")
ZERO_MARKER = "zlib_adler32"
"""A C function nothing else in the process calls (``zlib.adler32``): ``--zero-before`` zeroes the counters there."""

CLIENT_FUNCTIONS = ("Consumer_poll", "Consumer_consume", "Message_dealloc", "Consumer_store_offsets", "Consumer_commit")
"""confluent_kafka's C functions whose inclusive cost is the *client's* share of a record.

They hold what librdkafka and confluent_kafka do for a record in the caller's thread: the queue pop,
the ``Message`` and its copies made, and released when the application drops it, with nearly all of
glibc's malloc work, which is where a mode-on run's count varies; and, under a ``--pattern`` that
stores or commits, confluent_kafka's own ``store_offsets()`` and ``commit()``.  That code is the same
for every variant.  The rest of thread 1 (the *wrapper's* share) is what differs between them: fastrecover's
Python layer and C extension, or nothing for plain, plus the benchmark's loop, the same for all."""

TICK_CONSTANTS = (("fastrecover.steady", "TICK_S"), ("fastrecover.parallel", "_TICK_S"))
"""Where the mode-on consumer's tick period lives: since the units were composed, and before."""
AUTO_COMMIT_MS = 5000
"""librdkafka's default auto-commit interval, which the mode also uses for its range commits."""
TICK_SCALE = 50.0
"""About callgrind's slowdown: the tick period times this puts about as many records between ticks as natively."""

_TOOLS_ROOT = Path(__file__).resolve().parents[2]
_BUILD = """
import sys
from pathlib import Path
from setuptools import Distribution, Extension
root, out = Path(sys.argv[1]), Path(sys.argv[2])
src = str(root / "fastrecover" / "_fastpoll.c")
ext = Extension("fastrecover._fastpoll", sources=[src], extra_compile_args=["-O2"])
cmd = Distribution({"name": "fastrecover", "ext_modules": [ext]}).get_command_obj("build_ext")
cmd.build_lib = str(out / "lib")
cmd.build_temp = str(out / "temp")
cmd.ensure_finalized()
cmd.run()
"""


# ---------------------------------------------------------------------------------------------------------------
# The pure part: from callgrind's totals to figures.


def per_record(small: tuple[int, int], large: tuple[int, int]) -> float:
    """Instructions per record between two runs ``(records, instructions)``: the fixed cost cancels."""
    (n1, ir1), (n2, ir2) = small, large
    if n2 <= n1:
        raise ValueError(f"the larger run must read more records ({n2} <= {n1})")
    return (ir2 - ir1) / (n2 - n1)


def summarize(values: Sequence[float]) -> dict[str, float]:
    """Median, extremes and the spread ``(max - min) / median`` of one cell's repeats."""
    stat = Stat.of(values)  # the bench's own statistics over repeats
    if stat.median is None or stat.low is None or stat.high is None:
        raise ValueError("no values")
    median = stat.median
    return {
        "median": round(median, 1),
        "min": round(stat.low, 1),
        "max": round(stat.high, 1),
        "spread": round((stat.high - stat.low) / median, 5) if median else float("nan"),
    }


def ratio(numerator: float, denominator: float) -> float:
    return round(numerator / denominator, 4)


def wrapper_share(wrapper: float, wrapper_ref: float, whole_ref: float) -> float:
    """What one variant's wrapper adds per record over a reference's, as a fraction of the reference's whole count."""
    return round((wrapper - wrapper_ref) / whole_ref, 5)


def callgrind_total(text: str) -> int:
    """The Ir total of one callgrind output file (``totals:``, else ``summary:``; Ir is the first event)."""
    events = re.search(r"^events:\s*(\S+)", text, re.MULTILINE)
    if events is None or events.group(1) != "Ir":
        raise ValueError("not a callgrind file with Ir as its first event")
    for key in ("totals", "summary"):
        found = re.search(rf"^{key}:\s*(\d+)", text, re.MULTILINE)
        if found:
            return int(found.group(1))
    raise ValueError("no totals or summary line")


def inclusive_cost(annotated: str, names: Sequence[str]) -> int:
    """The summed inclusive Ir of the functions ``names`` in ``callgrind_annotate --inclusive=yes`` output.

    A function without debug information shows once (``???:name [object]``); one with it may show once
    per source file its code came from, each line a share of its cost.  A recursive call (``name'2``)
    is inside its outer call's inclusive cost, so it is not added again.
    """
    wanted = set(names)
    total = 0
    for line in annotated.splitlines():
        found = re.match(r"^\s*([\d,]+) \([\d. %]+\)\s+\S*?:(\S+?) \[", line)
        if found and found.group(2) in wanted:
            total += int(found.group(1).replace(",", ""))
    return total


def rotated(items: Sequence[str], by: int) -> list[str]:
    """``items`` started at ``by`` (mod len): each repeat starts with another variant."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


# ---------------------------------------------------------------------------------------------------------------
# One run, in a process under callgrind (``--worker``).


def _consumer(variant: str, bootstrap: str, store_url: str, tick_scale: float, pattern: str) -> Any:
    """The quickstart's consumer with ``pattern``'s settings; its commit cadence stretched as the tick is
    (see :func:`slow_ticks`)."""
    tag = uuid.uuid4().hex[:8]
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"instr-{tag}",
        "group.instance.id": f"instr-{tag}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": int(AUTO_COMMIT_MS * tick_scale),
        "session.timeout.ms": 30_000,
        **consumer_config(pattern),
    }
    if variant == PLAIN:
        from confluent_kafka import Consumer as RawConsumer

        return RawConsumer(conf)
    from fastrecover import Consumer

    return Consumer({**conf, "enable.parallel.rebalance": True, "fastrecover.store.url": store_url})


def slow_ticks(scale: float) -> list[str]:
    """The mode's tick period times ``scale``, wherever this commit keeps it; which constants were changed.

    The tick (the mode's periodic work, every 50 ms of wall clock, in the caller's thread) comes once
    per so many *seconds*; under callgrind a second holds about 50 times fewer records, so unscaled,
    every record would carry about 50 times its native share of the tick, and that share would follow
    the machine's load (which sets callgrind's speed), not the code.
    """
    changed = []
    for module_name, name in TICK_CONSTANTS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        if isinstance(getattr(module, name, None), float):
            setattr(module, name, getattr(module, name) * scale)
            changed.append(f"{module_name}.{name}")
    if not changed:
        raise RuntimeError(f"no tick period found in {[f'{m}.{n}' for m, n in TICK_CONSTANTS]}")
    return changed


def worker(
    variant: str,
    api: str,
    records: int,
    batch: int,
    bootstrap: str,
    topic: str,
    store_url: str,
    tick_scale: float,
    pattern: str = "auto",
) -> int:
    """Join, take the first record, zero the counters, read ``records`` records, print how many, ``os._exit``.

    Each record is stored or committed as ``pattern`` says (fastrecover_tools.bench.patterns), with
    methods looked up once the first record came: a commit whose mode is built at that call can be
    compared with one that builds it earlier.  Nothing closes the consumer: ``close()`` is a fixed cost
    that only adds noise to the difference.
    """
    scaled = slow_ticks(tick_scale) if variant != PLAIN else []
    consumer = _consumer(variant, bootstrap, store_url, tick_scale, pattern)
    consumer.subscribe([topic])
    deadline = time.monotonic() + 300  # a join under valgrind, which serializes every thread
    while True:
        msgs = consumer.consume(1, 0.5)
        if any(m.error() is None for m in msgs):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{variant}: no record within 300 s")
    on_message, on_batch = hooks(consumer, pattern)
    got = 0
    idle = 0
    calls = 0  # poll()/consume() calls: consume()'s cost per record follows the records each call returns
    zlib.adler32(b"")  # the zeroing marker: everything before it (imports, construction, join) is not counted
    if api == "poll":
        poll = consumer.poll
        while got < records:
            msg = poll(1.0)
            calls += 1
            if msg is None:
                idle += 1
                if idle > 60:
                    break
                continue
            if msg.error() is None:
                msg.value()
                if on_message is not None:
                    on_message(msg)
                got += 1
    else:
        consume = consumer.consume
        while got < records:
            msgs = consume(batch, 1.0)
            calls += 1
            if not msgs:
                idle += 1
                if idle > 60:
                    break
                continue
            for msg in msgs:
                if msg.error() is None:
                    msg.value()
                    if on_message is not None:
                        on_message(msg)
                    got += 1
            if on_batch is not None:
                on_batch()
    sys.stdout.write(json.dumps({"records": got, "calls": calls, "ticks_scaled": scaled}) + "\n")
    sys.stdout.flush()
    os._exit(0)


# ---------------------------------------------------------------------------------------------------------------
# The driver: worktrees, builds, the topic, the runs.


@dataclass(frozen=True)
class Variant:
    name: str
    root: Path | None  # the worktree whose fastrecover is imported; None for plain
    commit: str | None


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def _build_extension(root: Path, python: str) -> Path:
    """``_fastpoll.c`` compiled as the commit's ``hatch_build.py`` does (setuptools' build_ext, ``-O2``)."""
    with tempfile.TemporaryDirectory(prefix="instr-build-") as out:
        subprocess.run([python, "-c", _BUILD, str(root), out], check=True, capture_output=True, text=True)
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        built = Path(out) / "lib" / "fastrecover" / f"_fastpoll{suffix}"
        target = root / "fastrecover" / built.name
        shutil.copy2(built, target)
    return target


@contextmanager
def worktrees(repo: Path, commits: Sequence[str], under: Path, python: str) -> Iterator[list[Variant]]:
    """A detached worktree per commit, each with its own extension; removed on the way out."""
    made: list[Path] = []
    variants = [Variant(PLAIN, None, None)]
    try:
        for ref in commits:
            sha = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}")
            path = under / f"wt-{sha[:7]}"
            _git(repo, "worktree", "add", "--detach", str(path), sha)
            made.append(path)
            _build_extension(path, python)
            variants.append(Variant(f"fastrecover@{sha[:7]}", path, sha))
        yield variants
    finally:
        for path in made:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)], check=False)


def _env(variant: Variant) -> dict[str, str]:
    env = dict(os.environ)
    roots = [str(_TOOLS_ROOT)] if variant.root is None else [str(variant.root), str(_TOOLS_ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(roots)
    env["PYTHONHASHSEED"] = "0"  # the same dict and set layouts in every run
    return env


def check_imports(variant: Variant, python: str) -> str:
    """Where the variant's ``fastrecover`` comes from: its own worktree, with its own extension, or it fails."""
    if variant.root is None:
        return ""
    code = "import fastrecover, fastrecover._fastpoll as f; print(fastrecover.__file__); print(f.__file__)"
    out = subprocess.run([python, "-c", code], env=_env(variant), check=True, capture_output=True, text=True)
    package, ext = out.stdout.split()
    for path in (package, ext):
        if not Path(path).resolve().is_relative_to(variant.root.resolve()):
            raise RuntimeError(f"{variant.name} imports {path}, outside {variant.root}")
    return ext


def run_once(
    variant: Variant,
    api: str,
    records: int,
    *,
    batch: int,
    bootstrap: str,
    topic: str,
    workdir: Path,
    python: str,
    valgrind: str,
    timeout: float,
    tick_scale: float,
    annotate: str = "callgrind_annotate",
    pattern: str = "auto",
) -> tuple[int, int, int, int, list[str]]:
    """One process under callgrind: records read, Ir of thread 1 from the zeroing to the exit, the part of it
    in :data:`CLIENT_FUNCTIONS`, the calls that read the records, the tick constants."""
    tag = uuid.uuid4().hex[:8]
    out = workdir / f"cg-{tag}"
    store = workdir / f"store-{tag}.db"
    cmd = [
        valgrind,
        "--tool=callgrind",
        "--separate-threads=yes",
        f"--zero-before={ZERO_MARKER}",
        "--dump-instr=no",
        "--dump-line=no",
        f"--callgrind-out-file={out}",
        python,
        "-m",
        "fastrecover_tools.bench.steady_instructions",
        "--worker",
        f"--variant={variant.name}",
        f"--api={api}",
        f"--count={records}",
        f"--batch={batch}",
        f"--bootstrap={bootstrap}",
        f"--topic={topic}",
        f"--store-url=sqlite:///{store}",
        f"--tick-scale={tick_scale}",
        f"--pattern={pattern}",
    ]
    proc = subprocess.run(cmd, env=_env(variant), capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant.name}/{api}/{records}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    said = json.loads(proc.stdout.strip().splitlines()[-1])
    got, calls, scaled = int(said["records"]), int(said.get("calls", 0)), list(said["ticks_scaled"])
    if got < records:
        raise RuntimeError(f"{variant.name}/{api}/{records}: read {got} of {records} records")
    main_thread = Path(f"{out}-01")  # thread 1: the interpreter's main thread, the caller
    if not main_thread.is_file():
        raise RuntimeError(f"no per-thread file {main_thread.name}: was --separate-threads honoured?")
    ir = callgrind_total(main_thread.read_text(encoding="utf-8", errors="replace"))
    annotated = subprocess.run(
        [annotate, "--inclusive=yes", "--threshold=100", str(main_thread)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    client = inclusive_cost(annotated, CLIENT_FUNCTIONS)
    for path in workdir.glob(f"cg-{tag}*"):
        path.unlink()
    for path in workdir.glob(f"store-{tag}*"):
        path.unlink()
    return got, ir, client, calls, scaled


def _versions(python: str, valgrind: str) -> dict[str, str]:
    import confluent_kafka

    return {
        "valgrind": subprocess.run([valgrind, "--version"], capture_output=True, text=True, check=True).stdout.strip(),
        "python": platform.python_version(),
        "python_executable": python,
        "confluent_kafka": str(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def measure(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    from fastrecover_tools.bench.scenarios import produce_fast
    from fastrecover_tools.testing.broker import create_topic

    small, large = sorted(args.records)
    apis = [a.strip() for a in args.api.split(",") if a.strip()]
    workdir = Path(tempfile.mkdtemp(prefix="fastrecover-instr-"))
    topic = f"bench-instr-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, PARTITIONS)
    produce_fast(bootstrap, topic, large + 2 * args.batch + 1000, PARTITIONS)
    raw: dict[str, dict[str, list[dict[str, float]]]] = {}
    tick_constants: dict[str, list[str]] = {}
    try:
        with worktrees(Path(args.repo), args.commits.split(","), workdir, args.python) as variants:
            for v in variants:
                check_imports(v, args.python)
            names = [v.name for v in variants]
            by_name = {v.name: v for v in variants}
            raw = {v: {api: [] for api in apis} for v in names}
            for rep in range(args.repeats):
                for api in apis:
                    for name in rotated(names, rep):
                        runs: dict[int, tuple[int, int]] = {}
                        client: dict[int, int] = {}
                        calls: dict[int, int] = {}
                        for n in (small, large):
                            got, ir, client[n], calls[n], scaled = run_once(
                                by_name[name],
                                api,
                                n,
                                batch=args.batch,
                                bootstrap=bootstrap,
                                topic=topic,
                                workdir=workdir,
                                python=args.python,
                                valgrind=args.valgrind,
                                timeout=args.timeout,
                                tick_scale=args.tick_scale,
                                annotate=args.annotate,
                                pattern=args.pattern,
                            )
                            runs[n] = (got, ir)
                            tick_constants[name] = scaled
                        value = per_record(runs[small], runs[large])
                        wrapper = per_record(
                            (runs[small][0], runs[small][1] - client[small]),
                            (runs[large][0], runs[large][1] - client[large]),
                        )
                        raw[name][api].append(
                            {
                                "records_small": runs[small][0],
                                "ir_small": runs[small][1],
                                "records_large": runs[large][0],
                                "ir_large": runs[large][1],
                                "client_small": client[small],
                                "client_large": client[large],
                                "calls_small": calls[small],
                                "calls_large": calls[large],
                                "ir_per_record": round(value, 2),
                                "wrapper_ir_per_record": round(wrapper, 2),
                            }
                        )
                        cell = {"repeat": rep + 1, "api": api, "variant": name, **raw[name][api][-1]}
                        print(json.dumps(cell), flush=True)  # a partial run keeps its numbers
                        if args.json:
                            done = report(raw, {}, tick_constants, apis, small, large, args)
                            args.json.write_text(json.dumps(done, indent=2) + "\n", encoding="utf-8")
            commits = {v.name: v.commit for v in variants if v.commit}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report(raw, commits, tick_constants, apis, small, large, args)


def report(
    raw: dict[str, dict[str, list[dict[str, float]]]],
    commits: dict[str, str],
    tick_constants: dict[str, list[str]],
    apis: Sequence[str],
    small: int,
    large: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    names = list(raw)
    fastrecovers = [n for n in names if n != PLAIN]
    apis = [api for api in apis if all(raw[n][api] for n in names)]  # a partial run: the complete apis
    cells = {n: {api: summarize([r["ir_per_record"] for r in raw[n][api]]) for api in apis} for n in names}
    wrappers = {n: {api: summarize([r["wrapper_ir_per_record"] for r in raw[n][api]]) for api in apis} for n in names}
    ratios: dict[str, dict[str, float]] = {}
    added: dict[str, dict[str, float]] = {}
    for api in apis:
        med = {n: cells[n][api]["median"] for n in names}
        wrap = {n: wrappers[n][api]["median"] for n in names}
        base = fastrecovers[0]
        for n in fastrecovers:
            ratios.setdefault(f"{n} / {PLAIN}", {})[api] = ratio(med[n], med[PLAIN])
            added.setdefault(f"{n} - {PLAIN}", {})[api] = wrapper_share(wrap[n], wrap[PLAIN], med[PLAIN])
        for n in fastrecovers[1:]:
            ratios.setdefault(f"{n} / {base}", {})[api] = ratio(med[n], med[base])
            added.setdefault(f"{n} - {base}", {})[api] = wrapper_share(wrap[n], wrap[base], med[base])
    return {
        "what": (
            "instructions executed by the caller's thread (thread 1) per record, steady state, "
            f"commit pattern {args.pattern}"
        ),
        "pattern": args.pattern,
        "method": (
            f"callgrind --separate-threads=yes --zero-before={ZERO_MARKER}; per record = (Ir({large}) - Ir({small})) "
            f"/ (records({large}) - records({small})); {args.repeats} repeats, variants interleaved"
        ),
        "command": "python -m fastrecover_tools.bench.steady_instructions " + " ".join(args.argv),
        "topic": {"partitions": PARTITIONS, "value_bytes": VALUE_SIZE},
        "consume_batch": args.batch,
        "tick_scale": args.tick_scale,
        "tick_constants_scaled": {n: c for n, c in tick_constants.items() if c},
        "commits": commits or {n: n.partition("@")[2] for n in fastrecovers},
        "versions": _versions(args.python, args.valgrind),
        "ir_per_record": cells,
        "ratios": ratios,
        "wrapper_ir_per_record": wrappers,
        "wrapper_difference": {
            "what": (
                "the wrapper's instructions per record (thread 1 outside "
                + ", ".join(CLIENT_FUNCTIONS)
                + ") of one variant minus another's, as a fraction of the other's whole count per record"
            ),
            **added,
        },
        "raw": raw,
    }


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m fastrecover_tools.bench.steady_instructions",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--bootstrap", help="Kafka's bootstrap servers (default: $FASTRECOVER_BOOTSTRAP, else a local broker)"
    )
    parser.add_argument("--repo", default=".", help="the git repository holding the commits (default: .)")
    parser.add_argument("--commits", default="b5e1fcc,HEAD", help="commits, baseline first (default b5e1fcc,HEAD)")
    parser.add_argument("--api", default="poll,consume", help="comma-separated: poll, consume")
    parser.add_argument("--records", type=int, nargs=2, default=[10_000, 60_000], help="the two record counts")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=500, help="consume()'s num_messages")
    parser.add_argument(
        "--pattern",
        default="auto",
        choices=sorted(PATTERNS),
        help="how each record is committed (fastrecover bench's commit patterns; default auto: auto-commit)",
    )
    parser.add_argument(
        "--tick-scale",
        type=float,
        default=TICK_SCALE,
        help=f"the mode's tick period times this (default {TICK_SCALE:g})",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds one run under valgrind may take")
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run under valgrind")
    parser.add_argument("--valgrind", default="valgrind")
    parser.add_argument("--annotate", default="callgrind_annotate", help="valgrind's callgrind_annotate")
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    parser.add_argument("--store-url", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.argv = [a for a in argv if not a.startswith("--bootstrap")]
    if args.worker:
        return worker(
            args.variant,
            args.api,
            args.count,
            args.batch,
            args.bootstrap,
            args.topic,
            args.store_url,
            args.tick_scale,
            args.pattern,
        )
    broker = None
    bootstrap = args.bootstrap or os.environ.get("FASTRECOVER_BOOTSTRAP")
    if not bootstrap:
        from fastrecover_tools.testing.broker import select_broker

        broker = select_broker()
        bootstrap = broker.bootstrap
    try:
        out = measure(args, bootstrap)
    finally:
        if broker is not None:
            broker.close()
    for api in out["ir_per_record"][PLAIN]:
        for name, cells in out["ir_per_record"].items():
            cell = cells[api]
            print(f"{api:8s} {name:22s} median {cell['median']:9.1f} Ir/record, spread {cell['spread']:.2%}")
    for label, by_api in out["ratios"].items():
        print(f"{label}: " + ", ".join(f"{api} {r:.4f}" for api, r in by_api.items()))
    for api in out["wrapper_ir_per_record"][PLAIN]:
        for name, cells in out["wrapper_ir_per_record"].items():
            cell = cells[api]
            print(f"{api:8s} {name:22s} wrapper {cell['median']:9.1f} Ir/record, spread {cell['spread']:.2%}")
    for label, by_api in out["wrapper_difference"].items():
        if isinstance(by_api, dict):
            print(f"wrapper {label}: " + ", ".join(f"{api} {r:+.2%}" for api, r in by_api.items()))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
