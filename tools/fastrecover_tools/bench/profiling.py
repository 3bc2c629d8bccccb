"""Optional profiles of the bench's consumer processes: where the time goes when a goal is missed.

``fastrecover bench --profile DIR`` sets :data:`PROFILE_ENV`; each restart
worker and steady-state process then runs its consumer loop under cProfile and
writes ``DIR/<what>-<pid>.prof`` once it has reported (read with ``python -m
pstats`` or snakeviz).  Profiling slows the Python side unevenly, so the figures
of a profiled run are for finding hot spots, never for the tables.
"""

from __future__ import annotations

import cProfile
import os
from pathlib import Path

PROFILE_ENV = "FASTRECOVER_BENCH_PROFILE"


def start() -> cProfile.Profile | None:
    """A running profiler when the bench asked for profiles, else None."""
    if not os.environ.get(PROFILE_ENV):
        return None
    profiler = cProfile.Profile()
    profiler.enable()
    return profiler


def save(profiler: cProfile.Profile | None, what: str) -> None:
    """Stop ``profiler`` and write its stats under the profile directory (nothing when not profiling)."""
    if profiler is None:
        return
    profiler.disable()
    directory = Path(os.environ[PROFILE_ENV])
    directory.mkdir(parents=True, exist_ok=True)
    profiler.dump_stats(directory / f"{what}-{os.getpid()}.prof")
