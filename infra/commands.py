"""Shell commands that start, watch and stop a job's tasks on a node.

Pure functions from a ``NodeLayout`` and task names to bash text; what the
commands print is parsed in ``infra/facts.py``. The same text runs over SSH
(gce, ssh) and under local bash (local), so the local cluster tests the very
commands a GCE cluster gets.

Each task runs detached: ``setsid`` gives it its own session and process
group (so it survives the SSH channel, and one ``kill -- -PGID`` stops it
with any children), its output goes to ``<logs>/<task>.log``, its pid to
``<task>.pid``, and the wrapper writes its exit code to ``<task>.exit``.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from infra.transport import NodeLayout

# Every command starts in the login's home; relative layout paths are from
# there. H pins it (exported: the tasks' inner shells use it too), so a later
# `cd` cannot change what they mean.
# A pid file outlives a reboot (`stop` then `start` of the nodes), and its
# pid may then belong to another process: a task is alive only while that
# pid still runs the trainer (the task's bash -c line names it).
_PRELUDE = "\n".join(
    [
        'export H="$PWD"',
        "task_alive() { [ -n \"$1\" ] && kill -0 \"$1\" 2>/dev/null && "
        "grep -aqs -- '-m trainer' \"/proc/$1/cmdline\"; }",
    ]
)


def path(p: str) -> str:
    """A layout path as a bash word: absolute as is, relative from $H."""
    return shlex.quote(p) if p.startswith("/") else f'"$H"/{shlex.quote(p)}'


def _files(layout: NodeLayout, task: str) -> tuple[str, str, str]:
    base = f"{layout.logs.rstrip('/')}/{task}"
    return path(base + ".log"), path(base + ".pid"), path(base + ".exit")


def start_task(
    layout: NodeLayout,
    task: str,
    argv: Sequence[str],
    env: Mapping[str, str],
) -> str:
    """Start ``python -m trainer ARGV`` detached as ``task``, in the login's
    home (relative paths in ARGV are from there); prints ``started <pid>``.
    A task of the same name still running is an error (exit 3), so a job is
    never started twice on top of itself."""
    log, pid, exit_file = _files(layout, task)
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    # The inner shell runs the trainer and records its exit code; "$0" is the
    # exit file, passed as an argument so it is not quoted twice.
    inner = (
        f"{path(layout.python)} -m trainer "
        + " ".join(shlex.quote(a) for a in argv)
        + '; echo $? > "$0"'
    )
    return "\n".join(
        [
            _PRELUDE,
            f"mkdir -p {path(layout.logs)}",
            f'if [ -f {pid} ] && task_alive "$(cat {pid})"; then',
            f"  echo 'already running {task}' >&2; exit 3",
            "fi",
            f"rm -f {exit_file}",
            f"export PYTHONPATH={path(layout.code)} {exports}",
            # setsid: own session and process group, so the task outlives the
            # SSH channel and `kill -- -PID` reaches its children too;
            # </dev/null and the redirects free the channel at once.
            f"setsid bash -c {shlex.quote(inner)} {exit_file} > {log} 2>&1 < /dev/null &",
            f"echo $! > {pid}",
            "echo started $!",
        ]
    )


def wait_ports(layout: NodeLayout, tasks: Mapping[str, int], timeout: float) -> str:
    """Wait until each task listens on its port; prints one line per task:
    ``ready NAME``, ``dead NAME`` (its process ended) or ``timeout NAME``."""
    checks = []
    for task, port in sorted(tasks.items()):
        _, pid, _ = _files(layout, task)
        checks.append(
            f"s=timeout; while [ $SECONDS -lt {int(timeout) + 1} ]; do "
            f"if (echo > /dev/tcp/127.0.0.1/{port}) 2>/dev/null; then s=ready; break; fi; "
            f'if ! task_alive "$(cat {pid} 2>/dev/null)"; then s=dead; break; fi; '
            f"sleep 0.3; done; echo $s {task}"
        )
    return "\n".join([_PRELUDE, "SECONDS=0", *checks])


def task_status(layout: NodeLayout, tasks: Sequence[str]) -> str:
    """Prints ``NAME PID ALIVE EXIT`` per task (``-`` where unknown)."""
    lines = [_PRELUDE]
    for task in tasks:
        _, pid, exit_file = _files(layout, task)
        lines.append(
            f"p=$(cat {pid} 2>/dev/null || echo -); "
            f'if [ "$p" != - ] && task_alive "$p"; then a=1; else a=0; fi; '
            f"e=$(cat {exit_file} 2>/dev/null || echo -); echo {task} $p $a $e"
        )
    return "\n".join(lines)


def stop_tasks(layout: NodeLayout, tasks: Sequence[str], grace: float = 10.0) -> str:
    """TERM each task's process group, KILL what is left after ``grace``
    seconds; prints ``stopped NAME`` per task that was running."""
    lines = [_PRELUDE, "pids=''"]
    for task in tasks:
        _, pid, _ = _files(layout, task)
        lines.append(
            f"p=$(cat {pid} 2>/dev/null); "
            f'if task_alive "$p"; then '
            f'kill -TERM -- -"$p" 2>/dev/null || kill -TERM "$p"; pids="$pids $p"; '
            f"echo stopped {task}; fi"
        )
    lines.append(
        f"SECONDS=0; for p in $pids; do while kill -0 $p 2>/dev/null && "
        f"[ $SECONDS -lt {int(grace)} ]; do sleep 0.2; done; "
        f'kill -KILL -- -"$p" 2>/dev/null; done; true'
    )
    return "\n".join(lines)


def follow_log(layout: NodeLayout, task: str) -> str:
    """Print the task's log from the start and keep following it until the
    task's process ends (GNU tail --pid), then print its exit line."""
    log, pid, exit_file = _files(layout, task)
    return "\n".join(
        [
            _PRELUDE,
            f"p=$(cat {pid} 2>/dev/null || echo 0)",
            f"tail -n +1 -F --pid=\"$p\" {log} 2>/dev/null",
            f"echo \"@tfcluster-exit $(cat {exit_file} 2>/dev/null || echo -)\"",
        ]
    )


def tail_logs(layout: NodeLayout, lines: int, follow: bool) -> str:
    """Tail every task log of the node; with ``follow`` keep going."""
    flag = "-F" if follow else ""
    return "\n".join(
        [
            _PRELUDE,
            f"cd {path(layout.logs)} 2>/dev/null || exit 0",
            "ls *.log >/dev/null 2>&1 || exit 0",
            f"tail -v -n {int(lines)} {flag} *.log",
        ]
    )
