"""The processes of a test's job, found by their working folder: a job's
tasks run in the user's folder (or below it), whichever node started them,
so /proc tells what is still running after a test without asking tfcluster.
And ``CmdlineWatch``: what any process's command line showed meanwhile."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path


def runs(pid: int) -> bool:
    """Whether ``pid`` is a process that runs: not gone, not a zombie (a
    task's exit that PID 1 has not reaped yet; see commands.group_alive)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def processes_in(folder: Path) -> list[int]:
    """Pids of the processes whose working folder is ``folder`` or below it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(int(entry.name))
    return found


def none_left_in(folder: Path, grace_s: float = 15.0) -> None:
    """After a test: the processes in ``folder`` get ``grace_s`` to end (a
    cancel's SIGTERM is handled); those still there are killed, so that
    the next test starts clean, and the test fails naming them."""
    deadline = time.monotonic() + grace_s
    while (left := processes_in(folder)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):  # it ended just now
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes of the job still running in {folder}: {left}"


class CmdlineWatch:
    """Reads every process's command line, over and over, on a thread,
    while the ``with`` lasts; ``seen`` holds those that contained a word."""

    def __init__(self, *words: str) -> None:
        self.words = [w.encode() for w in words]
        self.seen: list[str] = []
        self.passes = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    argv = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if any(w in argv for w in self.words):
                    self.seen.append(argv.replace(b"\0", b" ").decode(errors="replace")[:200])
            self.passes += 1

    def __enter__(self) -> CmdlineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
