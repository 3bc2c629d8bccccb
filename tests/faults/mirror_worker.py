"""The test worker (``fastrecover_tools.testing.worker``) with the mirror window's fault points armed.

Run as ``python -m tests.faults.mirror_worker [--hold-store-open PATH] [--async-app-commits] -- WORKER ARGS``.
The worker's ``--stall-at`` does not offer these points, and a hook can only be armed inside the process:

* ``mirror-first-commit`` is always reported (``mirror-jump``): a recovery jumped on Kafka's marker;
* ``--hold-store-open PATH``: the store's background open reports ``store-open`` and waits until PATH
  exists (a path never created keeps the store opening, and the window open, until the SIGKILL);
* ``--pause-at-fresh PATH`` (with the worker's ``--first-fresh-after``): once the worker reported its first
  fresh record (finished, in the ledger, not committed) it waits until PATH exists: the test reads the store
  as it was when that record was delivered;
* ``--async-app-commits``: the worker's ``--commit-at`` commits (the application's metadata) go out
  asynchronous, like ``commit(offsets=..., asynchronous=True)``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from fastrecover import hooks
from fastrecover.consumer import Consumer
from fastrecover_tools.testing import worker
from fastrecover_tools.testing.waiting import wait_for

#: the longest a hold lasts: the test SIGKILLs the worker or releases it well within this
_HOLD_LIMIT_S = 300.0


def _report(event: str, **fields: Any) -> None:
    """One JSON line, written whole (the worker's own thread writes its events beside this one)."""
    os.write(1, (json.dumps({"event": event, "t": time.time(), **fields}) + "\n").encode())


def _until(path: Path) -> None:
    """The test creates ``path`` when it is done looking; past the deadline the worker fails loudly."""
    wait_for(path.exists, _HOLD_LIMIT_S, 0.01, f"the test to create {path}")


def _hold_until(path: Path) -> None:
    _report("store-open")
    _until(path)


def _pause_at_fresh(path: Path) -> None:
    """The worker's own report of its first fresh record (``worker._emit``) then waits for ``path``."""
    emit = worker._emit

    def pausing(event: str, **fields: Any) -> None:
        emit(event, **fields)
        if event == "fresh":
            _until(path)

    setattr(worker, "_emit", pausing)  # noqa: B010 - the worker reports through its module's _emit


def _async_app_commits() -> None:
    """Commits carrying the application's metadata go out asynchronous (the worker's --commit-at are sync)."""
    commit = Consumer.commit

    def asynchronous(self: Consumer, *args: Any, **kwargs: Any) -> Any:
        if any(getattr(tp, "metadata", None) for tp in kwargs.get("offsets") or ()):
            kwargs["asynchronous"] = True
        return commit(self, *args, **kwargs)

    setattr(Consumer, "commit", asynchronous)  # noqa: B010 - mypy refuses assigning to a method


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.faults.mirror_worker")
    parser.add_argument("--hold-store-open", type=Path)
    parser.add_argument("--pause-at-fresh", type=Path)
    parser.add_argument("--async-app-commits", action="store_true")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    hooks.register("mirror-first-commit", lambda: _report("mirror-jump"))
    if args.hold_store_open is not None:
        path: Path = args.hold_store_open
        hooks.register("store-open", lambda: _hold_until(path))
    if args.pause_at_fresh is not None:
        _pause_at_fresh(args.pause_at_fresh)
    if args.async_app_commits:
        _async_app_commits()
    return worker.run(argv[split + 1 :])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
