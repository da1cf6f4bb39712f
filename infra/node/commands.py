"""Shell commands that start, watch and stop a job's tasks on a node.

Pure functions from a ``NodeLayout`` and task names to bash text; what the
commands print is parsed in ``infra/node/facts.py``. The same text runs over SSH
(gce, ssh) and under local bash (local), so the local cluster tests the very
commands a GCE cluster gets.

Each task runs detached: ``setsid`` gives it its own session and process
group (so it survives the SSH channel, and one ``kill -- -PGID`` stops it
with any children), its output goes to ``<logs>/<task>.log``, its pid to
``<task>.pid``, and the wrapper (infra/node/watchdog.py) writes its exit code to
``<task>.exit``; the wrapper's watch ends the task when its job is over,
with nobody attached. The user's environment values reach it through a
private file (infra/node/task_env.py), never its command line. Autostop's shell
text is in infra/node/autostop_commands.py.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import replace

from infra.node.watchdog import Watch, renew_lease, watch_words, wrapper_argv
from infra.transport.base import NodeLayout

# TensorBoard runs as a task of its own (infra/jobs/tensorboard.py), logging in a
# folder of its own: the autostop watcher counts it as work.
TENSORBOARD_TASK = "tensorboard"


def board_layout(layout: NodeLayout) -> NodeLayout:
    """The node's layout with TensorBoard's own log folder."""
    return replace(layout, logs=f"{layout.root}/{TENSORBOARD_TASK}")


# Every command starts in the login's home; relative layout paths are from
# there. H pins it (exported: the tasks' inner shells use it too), so a later
# `cd` cannot change what they mean.
#
# A pid file outlives a reboot (`stop` then `start` of the nodes), and its pid
# may then belong to another process. So a pid file holds the pid *and* the
# process's start time (field 22 of /proc/PID/stat, in clock ticks since
# boot): a task is alive only while that pid runs a process that started at
# that very tick. This holds whatever the task runs (the built-in trainer or
# a user's program), unlike matching the command line. And since a pid file
# is a plain file anyone may edit, the process must also carry the task's
# TFCLUSTER_TASK=<name> in its environment (every task is started with it):
# an edited pid file naming some other process (a shell) never gets that
# process killed. `alive_pid FILE` prints the pid of a live task, nothing
# otherwise.
PRELUDE = "\n".join(
    [
        'export H="$PWD"',
        'start_tick() { local s; read -r s 2>/dev/null < "/proc/$1/stat" || return 0; '
        's=${s##*) }; set -- $s; echo "${20}"; }',
        'is_task() { local e; while IFS= read -r -d "" e; do '
        '[ "$e" = "TFCLUSTER_TASK=$2" ] && return 0; done 2>/dev/null < "/proc/$1/environ"; '
        "return 1; }",
        'alive_pid() { local p="" t="" n="${1##*/}"; n="${n%.pid}"; '
        'read -r p t 2>/dev/null < "$1"; '
        '[ -n "$p" ] && [ -n "$t" ] && [ "$(start_tick "$p")" = "$t" ] && '
        'is_task "$p" "$n" && echo "$p"; }',
        # Whether process $1, or any of its process group, still runs. Not
        # `kill -0`: that also finds zombies, and a task's processes become
        # the zombies of PID 1 (they outlive the shell that started them),
        # which a container's or microVM's init may reap only seconds later;
        # each stop and each job's end waited those seconds.
        "group_alive() { local g=$1 f s; for f in /proc/[0-9]*/stat; do "
        'read -r s 2>/dev/null < "$f" || continue; s=${s##*) }; set -- $s; '
        '{ [ "$3" = "$g" ] || [ "$f" = "/proc/$g/stat" ]; } && [ "$1" != Z ] && return 0; '
        "done; return 1; }",
    ]
)


def path(p: str) -> str:
    """A layout path as a bash word: absolute as is, relative from $H."""
    return shlex.quote(p) if p.startswith("/") else f'"$H"/{shlex.quote(p)}'


def _files(layout: NodeLayout, task: str) -> tuple[str, str, str]:
    base = f"{layout.logs.rstrip('/')}/{task}"
    return path(base + ".log"), path(base + ".pid"), path(base + ".exit")


def autostop_dir(layout: NodeLayout) -> str:
    """The node's autostop folder (infra/node/autostop_commands.py), as a layout
    path: a task that ends touches its ``active`` (the idle clock)."""
    return f"{layout.root.rstrip('/')}/autostop"


def start_task(
    layout: NodeLayout,
    task: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | None = None,
    run_dir: str | None = None,
    path_env: Mapping[str, str] | None = None,
    env_file: str | None = None,
    watch: Watch | None = None,
) -> str:
    """Start ``argv`` detached as ``task``; prints ``started TASK PID``.

    It runs in ``cwd`` (a layout path; default the login's home), with the
    node environment's ``bin`` first on PATH (so ``python`` is the one that
    has TensorFlow), ``env`` exported as literal values and ``path_env`` as
    layout paths (made absolute on the node). ``run_dir`` is created and
    exported as ``TFCLUSTER_RUN_DIR``. A task of the same name still running
    is an error (exit 3), so a job is never started on top of another one;
    a working folder that does not exist is exit 4.

    ``env``'s values are on the task's command line for a moment (``env
    K=V``), where any user of the node can read them: only tfcluster's own
    (TF_CONFIG, TFCLUSTER_*). The user's values (``--env``, ``job.env``)
    come from ``env_file`` (a layout path; ``task_env.put`` wrote it, 0600):
    the launching shell exports them, so they reach the task through its
    environment (readable by the user alone), never a command line; exit 5
    when it is missing. ``watch`` ends the task when its job is over
    (infra/node/watchdog.py)."""
    _, pid, exit_file = _files(layout, task)
    lines = [
        PRELUDE,
        f"mkdir -p {path(layout.logs)}",
        f'if [ -n "$(alive_pid {pid})" ]; then',
        f"  echo 'already running {task}' >&2; exit 3",
        "fi",
        f"rm -f {exit_file}",
    ]
    if env_file is not None:
        lines.append(
            f"[ -r {path(env_file)} ] || "
            f"{{ echo 'no environment file for {task} on this node' >&2; exit 5; }}"
        )
    paths = dict(path_env or {})
    if run_dir is not None:
        paths["TFCLUSTER_RUN_DIR"] = run_dir
        lines.append(f"mkdir -p {path(run_dir)}")
    if cwd is not None:
        lines.append(
            f"cd {path(cwd)} 2>/dev/null || "
            f"{{ echo 'no working folder '{shlex.quote(cwd)}' on this node' >&2; exit 4; }}"
        )
    lines += _watch_start(watch)
    lines += _launch(layout, task, argv, _assignments(env, paths), env_file, watch)
    return "\n".join(lines)


def _watch_start(watch: Watch | None) -> list[str]:
    """What the task's watch (infra/node/watchdog.py) needs before the task
    starts: the chief's pid file as it is now, or a fresh lease."""
    if watch is not None and watch.kind == "pid":
        # What the chief's pid file holds before this job's chief starts
        # (on its node, the chief is started after every other task).
        return [f'a= b=; read -r a b 2>/dev/null < {path(watch.target)}; tfc_snap="$a $b"']
    if watch is not None and watch.kind == "lease":
        return [renew_lease(path(watch.target))]
    return []


def _assignments(env: Mapping[str, str], paths: Mapping[str, str]) -> list[str]:
    """``NAME=value`` words: ``env``'s values literal, ``paths``' as layout
    paths (absolute on the node)."""
    assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return assignments + [f"{k}={path(v)}" for k, v in sorted(paths.items())]


def _launch(
    layout: NodeLayout,
    task: str,
    argv: Sequence[str],
    assignments: Sequence[str],
    env_file: str | None,
    watch: Watch | None,
) -> list[str]:
    """Start the task detached in its wrapper (infra/node/watchdog.py), write its
    pid file once the task can be found by it, and print ``started TASK
    PID``."""
    log, pid, exit_file = _files(layout, task)
    words = wrapper_argv(
        task,
        exit_file,
        path(autostop_dir(layout)),
        watch_words(watch, path(watch.target) if watch else "", "tfc_snap"),
        argv,
    )
    # The user's variables are exported last, in the subshell that becomes
    # the task: every word of the command (paths from $H included) is
    # expanded before, into "$@", so a variable named like one of this
    # script's (H, IFS, ...) cannot change where its pid and log files go
    # or how it reads /proc, and leave a task nobody can find or stop.
    load = []
    if env_file is not None:
        load = [
            f"  mapfile -d '' -t tfc_env < {path(env_file)} || exit 5",
            '  [ ${#tfc_env[@]} = 0 ] || export "${tfc_env[@]}"',
        ]
    return [
        f'export PATH={path(layout.bin)}:"$PATH"',
        # Every task carries its name: alive_pid looks for it.
        f"export TFCLUSTER_TASK={shlex.quote(task)}",
        # setsid: own session and process group, so the task outlives the
        # SSH channel and `kill -- -PID` reaches its children too;
        # </dev/null and the redirects free the channel at once. The
        # subshell execs setsid, which execs env, then the wrapper: one pid.
        "(",
        f"  set -- setsid env {' '.join(assignments)} {' '.join(words)}",
        f"  exec > {log} 2>&1 < /dev/null",
        *load,
        '  exec "$@"',
        ") &",
        "p=$!",
        # /proc/PID/environ is the one of the last exec: until setsid has
        # exec'd, it lacks TFCLUSTER_TASK, and the task would look dead. The
        # pid file is written once it is there (or the process is gone).
        # Bounded by a minute, not by the few seconds a fork and exec take
        # on an idle machine: on a loaded one they took longer, and a task
        # given up on too soon would look dead and, with its environment
        # file already removed by the script's end, start without it.
        'n=0; until is_task "$p" ' + shlex.quote(task) + " || [ $n -ge 6000 ] || "
        '! kill -0 "$p" 2>/dev/null; do sleep 0.01; n=$((n+1)); done',
        f'echo "$p $(start_tick "$p")" > {pid}',
        f'echo "started {task} $p"',
    ]


# The last lines of a task's log that a readiness poll reports.
OUTPUT_LINES = 20


def remove_on_exit(p: str) -> list[str]:
    """Lines that remove the file ``p`` (a layout path) when the script they
    start ends, however it ends: a start script's environment file, once
    every task it started has its environment."""
    return ['export H="$PWD"', f"tfc_gone={path(p)}", "trap 'rm -f -- \"$tfc_gone\"' EXIT"]


def wait_ports(layout: NodeLayout, tasks: Mapping[str, int], timeout: float) -> str:
    """Wait until each task listens on its port, at most ``timeout``
    seconds; prints one line per task: ``ready NAME``, ``dead NAME`` (its
    process ended) or ``timeout NAME``; then, for each task still waited
    for, ``lines NAME N`` (its log's line count) and its last complete
    lines, each as ``@log NAME LINE``. The tasks are watched together and
    the wait ends at the first death: a job with a dead task will not start,
    so waiting for the others only delays the error."""
    names = sorted(tasks)
    lines = [PRELUDE, "SECONDS=0"]
    lines += [f"s{i}=timeout" for i in range(len(names))]
    lines.append("while :; do")
    lines.append("  pending=0; died=0")
    for i, task in enumerate(names):
        _, pid, _ = _files(layout, task)
        lines.append(
            f'  if [ "$s{i}" = timeout ]; then '
            f"if (echo > /dev/tcp/127.0.0.1/{int(tasks[task])}) 2>/dev/null; then s{i}=ready; "
            f'elif [ -z "$(alive_pid {pid})" ]; then s{i}=dead; died=1; '
            f"else pending=1; fi; fi"
        )
    lines += [
        f"  if [ $pending = 0 ] || [ $died = 1 ] || [ $SECONDS -ge {int(timeout)} ]; "
        "then break; fi",
        "  sleep 0.3",
        "done",
    ]
    lines += [f'echo "$s{i} {task}"' for i, task in enumerate(names)]
    # What a task still waited for has written: its line count and its last
    # complete lines (a line still being written is left for the next poll),
    # for a live line of it and its output as it comes (facts.parse_output).
    for i, task in enumerate(names):
        log, _, _ = _files(layout, task)
        lines.append(
            f'if [ "$s{i}" = timeout ]; then n=$(wc -l < {log} 2>/dev/null || echo 0); '
            f'echo "lines {task} $n"; f=$((n > {OUTPUT_LINES} ? n - {OUTPUT_LINES - 1} : 1)); '
            f"tail -n +$f {log} 2>/dev/null | head -n $((n - f + 1)) | "
            f"sed 's/^/@log {task} /'; fi"
        )
    return "\n".join(lines)


def task_status(layout: NodeLayout, tasks: Sequence[str]) -> str:
    """Prints ``NAME PID ALIVE EXIT`` per task (``-`` where unknown)."""
    lines = [PRELUDE]
    for task in tasks:
        _, pid, exit_file = _files(layout, task)
        lines.append(
            f"p=; read -r p t 2>/dev/null < {pid}; p=${{p:--}}; "
            f'if [ -n "$(alive_pid {pid})" ]; then a=1; else a=0; fi; '
            f"e=$(cat {exit_file} 2>/dev/null || echo -); echo {task} $p $a $e"
        )
    return "\n".join(lines)


def stop_tasks(layout: NodeLayout, tasks: Sequence[str], grace: float = 10.0) -> str:
    """TERM each task's process group, KILL what is left after ``grace``
    seconds; prints ``stopped NAME`` per task that was running."""
    lines = [PRELUDE, "pids=''"]
    for task in tasks:
        _, pid, _ = _files(layout, task)
        lines.append(
            f"p=$(alive_pid {pid}); "
            f'if [ -n "$p" ]; then '
            f'kill -TERM -- -"$p" 2>/dev/null || kill -TERM "$p"; pids="$pids $p"; '
            f"echo stopped {task}; fi"
        )
    # The grace is for the whole process group: the task's wrapper bash
    # dies of the TERM at once, while the program in it (a chief saving a
    # checkpoint) may still be busy handling it.
    lines.append(
        f"SECONDS=0; for p in $pids; do "
        f'while group_alive "$p" && '
        f"[ $SECONDS -lt {int(grace)} ]; do sleep 0.05; done; "
        f'kill -KILL -- -"$p" 2>/dev/null; done; true'
    )
    # The node is idle from now on (if nothing else runs): autostop's clock.
    d = path(autostop_dir(layout))
    lines.append(f'[ -z "$pids" ] || [ ! -d {d} ] || touch {d}/active')
    return "\n".join(lines)


def follow_log(layout: NodeLayout, task: str) -> str:
    """Print the task's log from the start and keep following it until the
    task's process ends (GNU tail --pid), then print its exit line."""
    log, pid, exit_file = _files(layout, task)
    return "\n".join(
        [
            PRELUDE,
            f"p=$(alive_pid {pid})",
            # A task already gone: its whole log, no following. tail waits
            # for a watcher of ours, not for the task's pid: tail's test
            # (kill -0) takes the task's zombie for a live process (see
            # group_alive); alive_pid does not. This shell reaps the watcher
            # at once. -s: how often tail looks whether the watcher still
            # runs (default 1 s): the end of a job is seen within 0.4 s.
            'if [ -n "$p" ]; then',
            # The watcher also ends with this shell ($$ is still its pid in
            # the subshell): a follow cut off (Ctrl-C, a dropped SSH session)
            # leaves nothing polling on the node.
            f'  ( while [ -n "$(alive_pid {pid})" ] && kill -0 $$ 2>/dev/null; do sleep 0.2; '
            "done ) & w=$!",
            f'  tail -n +1 -F -s 0.2 --pid="$w" {log} 2>/dev/null',
            f"else cat {log} 2>/dev/null; fi",
            f'echo "@tfcluster-exit $(cat {exit_file} 2>/dev/null || echo -)"',
        ]
    )


def task_log_tail(layout: NodeLayout, task: str, lines: int) -> str:
    """The last ``lines`` lines of one task's log."""
    log, _, _ = _files(layout, task)
    return "\n".join([PRELUDE, f"tail -n {int(lines)} {log} 2>/dev/null || true"])


def in_workdir(layout: NodeLayout, workdir: str, argv: Sequence[str]) -> str:
    """``argv`` in the working folder with the node environment's ``bin``
    first on PATH, stderr with stdout (``deploy.py exec``)."""
    return "\n".join(
        [
            PRELUDE,
            f"cd {path(workdir)} 2>/dev/null || "
            f"{{ echo 'no working folder '{shlex.quote(workdir)}' on this node'; exit 4; }}",
            f'export PATH={path(layout.bin)}:"$PATH"',
            # A task like a job's (pid file, start tick, TFCLUSTER_TASK), so
            # that autostop's watcher sees the node busy while it runs; the
            # pid stays the command's own across `exec`.
            f"mkdir -p {path(layout.logs)} && "
            f'echo "$$ $(start_tick $$)" > {path(layout.logs.rstrip("/") + "/exec-")}"$$".pid',
            'export TFCLUSTER_TASK="exec-$$"',
            "exec " + " ".join(shlex.quote(a) for a in argv) + " 2>&1",
        ]
    )


def tail_logs(
    layout: NodeLayout, lines: int, follow: bool, until: Sequence[str] | None = None
) -> str:
    """Tail every task log of the node; with ``follow`` keep going: until
    Ctrl-C, or with ``until`` (task names) while any of those tasks runs
    (none: no following at all), so that a job's end ends the follow."""
    if until is not None and not until:
        follow = False
    head = [
        PRELUDE,
        f"cd {path(layout.logs)} 2>/dev/null || exit 0",
        "ls *.log >/dev/null 2>&1 || exit 0",
    ]
    if not follow:
        return "\n".join([*head, f"tail -v -n {int(lines)} *.log"])
    if until is None:
        return "\n".join([*head, f"tail -v -n {int(lines)} -F *.log"])
    alive = " || ".join(f'[ -n "$(alive_pid {_files(layout, t)[1]})" ]' for t in until)
    return "\n".join(
        [
            *head,
            # As follow_log's watcher: it also ends with this shell.
            f"( while {{ {alive}; }} && kill -0 $$ 2>/dev/null; do sleep 0.2; done ) & w=$!",
            f'tail -v -n {int(lines)} -F -s 0.2 --pid="$w" *.log 2>/dev/null',
        ]
    )


def cpu_count() -> str:
    """How many CPUs this node's processes may use (``deploy.py sweep``
    checks ``--per-node`` against it); prints ``cpus N``."""
    return 'echo "cpus $(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo -)"'


def file_exists(p: str) -> str:
    """Prints ``yes`` when the file ``p`` (a layout path) exists."""
    return "\n".join([PRELUDE, f"if [ -e {path(p)} ]; then echo yes; else echo no; fi"])
