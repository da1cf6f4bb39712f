"""The local cluster's tasks in a network namespace of their own.

Why: ``tf.distribute.Server`` (the trainer's, and a user's own) listens on
every address of the machine whatever TF_CONFIG names, and a TensorFlow
server runs any operation it is sent. The local cluster's tasks are
processes of this machine: without this, anyone on its network (a café's,
a conference's) could read and write the user's files while a job runs.

How: one network namespace per local cluster, shared by all its tasks,
which reach each other on its own loopback (TF_CONFIG's 127.0.0.1) while
nothing outside it reaches them. Linux lets a user without root make one
inside a user namespace of their own; the user is mapped to itself there
(the tasks keep their uid). The namespace lives as long as a holder process
(infra/providers/netns_holder.py: ``sleep infinity`` once it is made),
created by `up` or a job's first confined command and ended by `down`. Its
record, ``netns`` in the cluster's state folder, names it by pid, start
tick and namespace id: after a reboot (or a killed holder) the record
names nothing alive and a new namespace is made. A lock makes two commands
at once make one namespace, not two.

What runs inside: only what a transport runs with ``run_in_task_network``,
that is ``Job.start``'s commands: the start of a job's tasks and the probes
that wait for their ports (``commands.wait_ports`` connects to the ports
where they are). Everything else runs outside, as before: status, stop,
cancel and Ctrl-C (they read /proc and pid files and send signals, which a
network namespace does not hide: the pids are the same), following the
chief's log, fetch, `exec`, sweeps, TensorBoard (which the operator reaches
at this machine's 127.0.0.1) and any helper process a node runs beside the
tasks. Each command entered checks first that it is in the namespace the
record names; if not, it fails instead of running unconfined.

What the tasks lose: every network beyond each other (a download, gs://).
The launcher fills what the built-in trainer would download (MNIST) on the
host side first (``LocalProvider.before_tasks``). cluster.yaml's
``local.network: host`` runs them on this machine's network instead, with
a warning; so does a system that cannot make the namespace (not Linux, no
nsenter, unprivileged user namespaces off), which says why.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import platform
import shlex
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from infra.state.lock import open_lock_file

HOLDER = Path(__file__).resolve().with_name("netns_holder.py")
# Seconds a new namespace may take (an interpreter's start on a busy machine).
CREATE_TIMEOUT_S = 30.0
# Exit code of a command that did not find itself in the recorded namespace.
NOT_CONFINED_EXIT = 125


@dataclass(frozen=True)
class Holder:
    """The process that keeps a namespace: pid, start tick (field 22 of
    /proc/PID/stat) and ``net:[inode]``."""

    pid: int
    tick: str
    netns: str

    def line(self) -> str:
        return f"{self.pid} {self.tick} {self.netns}\n"

    @classmethod
    def parse(cls, text: str) -> Holder | None:
        """A record's line; None for anything else (a damaged file)."""
        parts = text.split()
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
            return None
        if not (parts[2].startswith("net:[") and parts[2].endswith("]")):
            return None
        return cls(int(parts[0]), parts[1], parts[2])

    def alive(self) -> bool:
        """Whether this very process still runs (its pid, started at that
        tick, not a zombie) and still holds that namespace."""
        stat = _stat(self.pid)
        if stat is None or stat[0] == "Z" or stat[19] != self.tick:
            return False
        try:
            return os.readlink(f"/proc/{self.pid}/ns/net") == self.netns
        except OSError:
            return False


def _stat(pid: int) -> list[str] | None:
    """/proc/PID/stat's fields after the command name (state first)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields if len(fields) > 19 else None


class TaskNetwork:
    """One local cluster's namespace, kept in its state ``folder``.

    ``ensure`` makes (or finds) it and says why not where it cannot;
    ``argv`` is how to run a bash command in it; ``end`` ends it."""

    def __init__(self, folder: Path, python: str) -> None:
        self.folder = folder
        self.python = python
        self.record = folder / "netns"
        self._found: Holder | str | None = None

    def ensure(self) -> Holder | str:
        """The namespace's holder, made now if there is none alive; or why
        this system cannot make one (one clause). Asked once per object:
        a command does not ask again for each of its commands."""
        if self._found is None or (isinstance(self._found, Holder) and not self._found.alive()):
            self._found = self._ensure()
        return self._found

    def _ensure(self) -> Holder | str:
        why = cannot_confine()
        if why is not None:
            return why
        self.folder.mkdir(parents=True, exist_ok=True)
        fd = open_lock_file(self.folder / "netns.lock")
        try:
            # Held while the record is read and a namespace made: a second
            # command waits here and then finds the first one's.
            fcntl.flock(fd, fcntl.LOCK_EX)
            holder = self.current()
            if holder is not None:
                return holder
            made = self._make()
            if isinstance(made, Holder):
                tmp = self.record.with_name(f".netns-{os.getpid()}")
                tmp.write_text(made.line())
                os.replace(tmp, self.record)
            return made
        finally:
            os.close(fd)

    def current(self) -> Holder | None:
        """The recorded holder if it is alive; None otherwise (no record,
        a damaged one, or one from before a reboot)."""
        try:
            holder = Holder.parse(self.record.read_text())
        except OSError:
            return None
        return holder if holder is not None and holder.alive() else None

    def _make(self) -> Holder | str:
        try:
            done = subprocess.run(
                [self.python, "-I", "-S", str(HOLDER)],
                capture_output=True,
                text=True,
                errors="replace",
                timeout=CREATE_TIMEOUT_S,
                stdin=subprocess.DEVNULL,
                cwd="/",
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"its network namespace could not be made ({exc})"
        words = done.stdout.split()
        if words[:1] == ["ready"] and len(words) == 3 and words[1].isdigit():
            stat = _stat(int(words[1]))
            holder = Holder(int(words[1]), stat[19] if stat else "", words[2])
            if holder.alive():
                return holder
        said = " ".join(words[1:]) if words[:1] == ["error"] else done.stderr.strip()[-200:]
        return (
            f"this system refuses user namespaces ({said or 'no answer'}; see sysctl "
            "kernel.unprivileged_userns_clone, user.max_user_namespaces, AppArmor's "
            "restrict_unprivileged_userns)"
        )

    def argv(self, command: str) -> list[str] | None:
        """How to run the bash ``command`` in the namespace; None where it
        cannot be made (``ensure`` says why)."""
        holder = self.ensure()
        if not isinstance(holder, Holder):
            return None
        # The pid may have been reused since it was checked (the holder
        # killed meanwhile): the command then finds another namespace
        # than the recorded one and fails rather than run unconfined.
        guard = (
            f'[ "$(readlink /proc/self/ns/net)" = {shlex.quote(holder.netns)} ] || '
            "{ echo \"not in the local cluster's network namespace (run the command again)\" >&2; "
            f"exit {NOT_CONFINED_EXIT}; }}"
        )
        return [
            "nsenter", "--target", str(holder.pid), "--user", "--net",
            "--preserve-credentials", "--", "bash", "-c", guard + "\n" + command,
        ]  # fmt: skip

    def end(self) -> bool:
        """End the namespace's holder (`down`); whether one was running. The
        tasks still in it (none after `down`) would keep the namespace."""
        fd = open_lock_file(self.folder / "netns.lock") if self.folder.is_dir() else None
        if fd is None:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            holder = self.current()
            if holder is not None:
                with contextlib.suppress(OSError):  # ended meanwhile
                    os.kill(holder.pid, signal.SIGTERM)
            self.record.unlink(missing_ok=True)
            self._found = None
            return holder is not None
        finally:
            os.close(fd)


def cannot_confine() -> str | None:
    """Why this system cannot run tasks in a namespace of their own, before
    trying; None where it may."""
    system = platform.system()
    if system != "Linux":
        name = "macOS" if system == "Darwin" else system or "this system"
        return f"{name} has no network namespaces"
    if shutil.which("nsenter") is None:
        return "nsenter (util-linux) is not installed"
    return None


# -- what the user is told --------------------------------------------------------------

NO_NETWORK = (
    "local cluster: the tasks have a network namespace of their own: other machines cannot "
    "reach them, and they reach no network (downloads, gs://); `local: {network: host}` "
    "in cluster.yaml gives them this machine's network, their ports open to other machines"
)

_WHAT = "any machine that reaches this one can run operations in them, as you"


def open_at_up(why: str) -> str:
    """`up`'s warning where the tasks cannot be confined (``why``)."""
    return (
        f"local cluster: its TensorFlow servers will listen on every address of this machine "
        f"({why}): {_WHAT}, while a job runs; block inbound TCP from other machines with a "
        "host firewall (`train` and `run` name each job's ports)"
    )


def open_at_job(why: str, ports: list[int]) -> str:
    """`train`'s and `run`'s warning, naming the job's ports."""
    named = ", ".join(str(p) for p in sorted(set(ports)))
    return (
        f"local cluster: this job's TensorFlow servers listen on every address of this "
        f"machine, ports {named} ({why}): {_WHAT}, while the job runs; block inbound TCP "
        "to those ports from other machines with a host firewall"
    )
