"""The per-cluster lock: one command at a time changes a cluster.

Two ``up``s at once would both plan "create pc-1"; a ``cancel`` during a
``train``'s launch would stop half-started tasks; GCE's zone failover
cleans up what it created in a zone and must not meet nodes a parallel
``up`` has just adopted. So every command that changes the cluster or its
state (up, start, stop, down, the launch of train/run, cancel) holds this
lock; read-only ones (status, logs, fetch, ssh) never wait for it.

It is ``fcntl.flock`` on ``cluster.lock`` in the cluster's state folder:
the kernel drops it when its holder exits, crashed or killed, so there is
no stale lock to clean up. The holder writes who it is into the file (pid,
command, start time), so that a waiter can say what it waits for. A waiter
waits a bounded time (``TFCLUSTER_LOCK_WAIT`` seconds, default 30), then
fails with one line naming the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.errors import ConfigError, StateError

log = logging.getLogger("tfcluster")

LOCK_WAIT_ENV = "TFCLUSTER_LOCK_WAIT"
DEFAULT_WAIT_S = 30.0
_POLL_S = 0.1
# What a holder may call itself: a command word (the file is ours, but what
# is read back is still shown to a user: nothing odd gets through).
_COMMAND = re.compile(r"^[a-z][a-z0-9-]{0,30}\Z")


def lock_wait() -> float:
    """How long a command waits for a busy cluster: TFCLUSTER_LOCK_WAIT, else 30 s."""
    text = os.environ.get(LOCK_WAIT_ENV)
    if not text:
        return DEFAULT_WAIT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1e6:
        raise ConfigError(
            f"{LOCK_WAIT_ENV}={text[:60]!r}: not a number of seconds; set e.g. {LOCK_WAIT_ENV}=60"
        )
    return value


def open_lock_file(path: Path) -> int:
    """Open (create) a lock file; never through a symlink: the holder
    truncates and writes its lock file, which must not be some other file
    a link points at."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise StateError(
            f"{path} is a symbolic link, not a lock file of tfcluster; remove it"
        ) from None


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as its file says."""

    pid: int
    command: str
    since: float  # epoch seconds

    def describe(self) -> str:
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        return f"`deploy.py {self.command}` (pid {self.pid}, since {when})"

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        try:
            data = json.loads(text)
            pid, command, since = data["pid"], data["command"], data["since"]
        except (ValueError, TypeError, KeyError):
            return None
        if (
            type(pid) is not int
            or not isinstance(command, str)
            or not _COMMAND.match(command)
            or not isinstance(since, int | float)
            or isinstance(since, bool)
        ):
            return None
        return cls(pid, command, float(since))


class ClusterLock:
    """The lock of one cluster (``path``: its lock file).

    Re-entrant for the thread that holds it (a locked method may call
    another); any other thread or process waits, since each acquisition
    opens the file anew and flock locks belong to an open file."""

    def __init__(self, path: Path, cluster: str) -> None:
        self.path = path
        self.cluster = cluster
        self._owner: int | None = None
        self._depth = 0

    @contextlib.contextmanager
    def hold(self, command: str, *, wait: float | None = None) -> Iterator[None]:
        """Hold the lock as ``command`` (a deploy.py command word); wait at
        most ``wait`` seconds (default: ``lock_wait()``) for another holder."""
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            try:
                yield
            finally:
                self._depth -= 1
            return
        fd = self._acquire(command, lock_wait() if wait is None else wait)
        self._owner, self._depth = me, 1
        try:
            yield
        finally:
            self._owner, self._depth = None, 0
            # Emptied before the unlock: a waiter never reads a former holder.
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the last descriptor drops the flock

    def holder(self) -> Holder | None:
        """Who holds the lock now, if anyone says so (for messages and tests)."""
        try:
            return Holder.parse(self.path.read_text(errors="replace"))
        except OSError:
            return None

    def _acquire(self, command: str, wait: float) -> int:
        if not _COMMAND.match(command):
            raise ValueError(f"not a command word: {command[:60]!r}")
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        deadline = time.monotonic() + wait
        said = False
        while True:
            fd = open_lock_file(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = self.holder()
                if time.monotonic() >= deadline:
                    raise self._busy(holder, wait) from None
                if not said:
                    # Once, so that a command that seems to hang says why.
                    log.warning(
                        "%s is busy: %s holds it; waiting up to %g s",
                        self.cluster,
                        holder.describe() if holder else "another tfcluster command",
                        wait,
                    )
                    said = True
                time.sleep(min(_POLL_S, max(0.0, deadline - time.monotonic())))
                continue
            except BaseException:
                os.close(fd)
                raise
            if not self._same_file(fd):
                # The file was deleted (or replaced) between our open and our
                # flock: a lock on the old one excludes nobody. Try again.
                os.close(fd)
                continue
            record = {"pid": os.getpid(), "command": command, "since": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
            return fd

    def _same_file(self, fd: int) -> bool:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return False
        mine = os.fstat(fd)
        return (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino)

    def _busy(self, holder: Holder | None, wait: float) -> StateError:
        who = holder.describe() if holder else "another tfcluster command"
        hint = f"wait for it to finish, or raise {LOCK_WAIT_ENV} (seconds) to wait longer"
        if holder:
            hint += f"; if it hangs, stop it (kill {holder.pid})"
        return StateError(
            f"{self.cluster} is busy: held by {who}; gave up after {wait:g} s", hint=hint
        )
