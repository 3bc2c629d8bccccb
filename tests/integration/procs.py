"""Driving consumer worker processes: start, wait for a milestone, SIGKILL."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

from fastrecover_tools.testing.waiting import Deadline

REPO = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """A ``fastrecover_tools.testing.worker`` subprocess and the events it printed."""

    def __init__(self, args: list[str], log_path: Path, *, module: str = "fastrecover_tools.testing.worker") -> None:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tools"), os.environ.get("PYTHONPATH", "")])
        )
        self._stderr = open(log_path, "ab")  # noqa: SIM115 - closed in kill()/wait()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=env,
            text=True,
            cwd=str(log_path.parent),
        )
        self.events: list[dict[str, Any]] = []
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self._queue.put(json.loads(line))
            except json.JSONDecodeError:
                continue

    def wait_event(self, name: str, timeout: float) -> dict[str, Any]:
        """Block until the worker reports ``name`` (or fail with what it did report)."""
        for event in self.events:
            if event["event"] == name:
                return event
        deadline = Deadline(timeout)
        while not deadline.expired():
            try:
                event = self._queue.get(timeout=max(0.01, min(0.5, deadline.remaining())))
            except queue.Empty:
                if self.proc.poll() is not None and self._queue.empty():
                    break
                continue
            self.events.append(event)
            if event["event"] == name:
                return event
        raise TimeoutError(f"worker never reported {name!r} (exit={self.proc.poll()}, events={self.events[-5:]})")

    def sigkill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self._stderr.close()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._stderr.close()
