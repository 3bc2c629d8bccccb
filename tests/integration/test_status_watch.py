"""``fastrecover status --watch`` in a real pseudo-terminal, on a real SQLite store whose range moves.

The command runs as its own session with the pty as its controlling terminal,
so Ctrl-C is the byte 0x03 typed into the terminal and the kernel's line
discipline turns it into SIGINT, as at a keyboard.  No broker is needed.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
from collections.abc import Callable
from pathlib import Path

from fastrecover.ranges import RangeProgress
from fastrecover.status import CLEAR_BELOW, HIDE_CURSOR, HOME, SHOW_CURSOR
from fastrecover.store import ProgressUpdate, open_store
from fastrecover_tools.testing.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0

# Both tests stop the command with SIGINT, so the child sets SIGINT's disposition itself instead of
# inheriting the runner's: a suite started in the background by a non-interactive shell runs with SIGINT
# ignored, an ignored signal stays ignored across exec, and Python then installs no KeyboardInterrupt
# handler, so the command would never stop.  The default disposition before exec is what a user's
# shell gives a foreground command; Python turns it into KeyboardInterrupt.  (The CLI itself keeps an
# inherited SIG_IGN on purpose: that is how a shell keeps a Ctrl-C meant for the foreground job away
# from the jobs it started with `&`.)
_DEFAULT_SIGINT = "import signal; signal.signal(signal.SIGINT, signal.SIG_DFL)"
# Runs in the child: SIGINT's default, then become the terminal's controlling process (after setsid), then
# exec the CLI.
_SPAWN = (
    f"{_DEFAULT_SIGINT}; import fcntl, os, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, sys.argv[1:])"
)
# Runs in the child: SIGINT's default, then exec the CLI.
_WITH_DEFAULT_SIGINT = f"{_DEFAULT_SIGINT}; import os, sys; os.execv(sys.executable, sys.argv[1:])"


class _Terminal:
    """A pty whose output a thread collects (a full pty buffer would block the command)."""

    def __init__(self, argv: list[str], rows: int = 40, cols: int = 200) -> None:
        self.master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tools")]),
            "LC_ALL": "C.UTF-8",
            "TERM": "xterm",
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SPAWN, sys.executable, *argv],
            stdin=slave,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
            env=env,
            close_fds=True,
        )
        os.close(slave)
        self._chunks: list[bytes] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the other side closed
                return
            if not data:
                return
            with self._lock:
                self._chunks.append(data)

    def text(self) -> str:
        with self._lock:
            return b"".join(self._chunks).decode("utf-8", errors="replace")

    def frames(self) -> list[str]:
        """The screens drawn so far (each starts with cursor-home)."""
        return self.text().split(HOME)[1:]

    def wait_frame(self, check: Callable[[str], bool], what: str) -> str:
        def found() -> str | None:
            return next((f for f in reversed(self.frames()) if check(f)), None)

        try:
            frame = wait_for(found, TIMEOUT, 0.05, what)
            assert frame is not None
            return frame
        except TimeoutError as exc:
            raise AssertionError(f"{exc}; terminal so far:\n{self.text()[-3000:]!r}") from exc

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)
        self._reader.join(TIMEOUT)
        os.close(self.master)


def _range_line(frame: str, token_id: int) -> str:
    for line in frame.split("\n"):
        cells = line.replace(CLEAR_BELOW, "").split()
        if len(cells) > 4 and cells[0] == "grp" and cells[3] == str(token_id):
            return line
    raise AssertionError(f"no line for range #{token_id} in {frame!r}")


def test_watch_redraws_bars_and_eta_and_ctrl_c_exits_0(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url) as store:
        token = store.create_range("grp", "orders", 0, 0, 1000, "host-1")

        def move_to(committed: int) -> None:
            store.commit_one(ProgressUpdate(token.id, "host-1", 1, RangeProgress(0, 1000, committed)))

        term = _Terminal(["-m", "fastrecover", "status", "--store-url", url, "--watch", "--interval", "0.2"])
        try:
            first = term.wait_frame(lambda f: "  0.0%" in f, "the first screen")
            line = _range_line(first, token.id)
            assert "[--------------------]   0.0%" in line
            assert "1000" in line and "—" in line  # remaining; ETA unknown until progress is seen

            move_to(250)
            quarter = term.wait_frame(lambda f: " 25.0%" in f, "the screen after the range moved to 25 %")
            assert "[#####---------------]  25.0%" in _range_line(quarter, token.id)

            move_to(600)
            later = term.wait_frame(
                lambda f: " 60.0%" in f and re.search(r"estimated time left \d", f) is not None,
                "a screen at 60 % with an estimate of the time left",
            )
            line = _range_line(later, token.id)
            assert "[############--------]  60.0%" in line
            assert re.search(r"\d+(\.\d)?/s", line) and re.search(r"\d+ (s|min)", line), line

            text = term.text()
            assert text.startswith(HIDE_CURSOR)  # redrawn in place: cursor hidden, home, each line cleared
            assert len(term.frames()) >= 3

            term.type(b"\x03")  # Ctrl-C at the keyboard: SIGINT from the terminal's line discipline
            assert term.proc.wait(TIMEOUT) == 0
            term._reader.join(TIMEOUT)
            assert term.text().rstrip("\r\n").endswith(SHOW_CURSOR)  # the cursor is given back
            assert "Traceback" not in term.text()
        finally:
            term.close()


def test_watch_without_a_terminal_prints_successive_tables(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(url) as store:
        token = store.create_range("grp", "orders", 0, 0, 1000, "host-1")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tools")])}
    argv = ["-m", "fastrecover", "status", "--store-url", url, "--watch", "--interval", "0.1"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_DEFAULT_SIGINT, sys.executable, *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    seen: list[str] = []

    def collect() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)

    reader = threading.Thread(target=collect, daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: sum(1 for x in list(seen) if x.startswith("fastrecover status ")) >= 2,
            TIMEOUT,
            0.05,
            "two tables on the pipe",
        )
        proc.send_signal(signal.SIGINT)
        assert proc.wait(TIMEOUT) == 0
        reader.join(TIMEOUT)
        assert proc.stderr is not None
        err = proc.stderr.read()
        text = "".join(seen)
        assert "\x1b" not in text  # no terminal control on a pipe
        assert re.search(rf"grp\s+orders\s+0\s+{token.id}\s+\[-{{20}}\]\s+0\.0%", text), text
        assert "Traceback" not in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(TIMEOUT)
