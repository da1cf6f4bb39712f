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
_PRELUDE = "\n".join(
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
        'group_alive() { local g=$1 f s; for f in /proc/[0-9]*/stat; do '
        'read -r s 2>/dev/null < "$f" || continue; s=${s##*) }; set -- $s; '
        '{ [ "$3" = "$g" ] || [ "$f" = "/proc/$g/stat" ]; } && [ "$1" != Z ] && return 0; '
        "done; return 1; }",
    ]
)

# For the commands of other modules (infra/storage/commands.py).
PRELUDE = _PRELUDE


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
    *,
    cwd: str | None = None,
    run_dir: str | None = None,
    path_env: Mapping[str, str] | None = None,
) -> str:
    """Start ``argv`` detached as ``task``; prints ``started TASK PID``.

    It runs in ``cwd`` (a layout path; default the login's home), with the
    node environment's ``bin`` first on PATH (so ``python`` is the one that
    has TensorFlow), ``env`` exported as literal values and ``path_env`` as
    layout paths (made absolute on the node). ``run_dir`` is created and
    exported as ``TFCLUSTER_RUN_DIR``. A task of the same name still running
    is an error (exit 3), so a job is never started on top of another one;
    a working folder that does not exist is exit 4."""
    _, pid, exit_file = _files(layout, task)
    lines = [
        _PRELUDE,
        f"mkdir -p {path(layout.logs)}",
        f'if [ -n "$(alive_pid {pid})" ]; then',
        f"  echo 'already running {task}' >&2; exit 3",
        "fi",
        f"rm -f {exit_file}",
    ]
    paths = dict(path_env or {})
    if run_dir is not None:
        paths["TFCLUSTER_RUN_DIR"] = run_dir
        lines.append(f"mkdir -p {path(run_dir)}")
    if cwd is not None:
        lines.append(
            f"cd {path(cwd)} 2>/dev/null || "
            f"{{ echo 'no working folder '{shlex.quote(cwd)}' on this node' >&2; exit 4; }}"
        )
    lines += _launch(layout, task, argv, _assignments(env, paths))
    return "\n".join(lines)


def _assignments(env: Mapping[str, str], paths: Mapping[str, str]) -> list[str]:
    """``NAME=value`` words: ``env``'s values literal, ``paths``' as layout
    paths (absolute on the node)."""
    # The variables reach the task through `env`, never `export` into this
    # script: a user's variable named like one the script itself uses (H,
    # IFS, ...) would otherwise change where its pid and log files go or
    # how it reads /proc, and leave a task nobody can find or stop.
    assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())]
    return assignments + [f"{k}={path(v)}" for k, v in sorted(paths.items())]


def _launch(
    layout: NodeLayout, task: str, argv: Sequence[str], assignments: Sequence[str]
) -> list[str]:
    """Start the task detached, write its pid file once the task can be
    found by it, and print ``started TASK PID``."""
    log, pid, exit_file = _files(layout, task)
    # The inner shell runs the command and records its exit code. "$1" is
    # the exit file, passed as an argument so it is not quoted twice; "$0"
    # is the task's name, which bash puts before its own errors
    # ("worker-0: line 1: train.py: command not found").
    inner = " ".join(shlex.quote(a) for a in argv) + '; echo $? > "$1"'
    return [
        f'export PATH={path(layout.bin)}:"$PATH"',
        # Every task carries its name: alive_pid looks for it.
        f"export TFCLUSTER_TASK={shlex.quote(task)}",
        # setsid: own session and process group, so the task outlives the
        # SSH channel and `kill -- -PID` reaches its children too;
        # </dev/null and the redirects free the channel at once.
        f"setsid env {' '.join(assignments)} bash -c {shlex.quote(inner)} "
        f"{shlex.quote(task)} {exit_file} "
        f"> {log} 2>&1 < /dev/null &",
        "p=$!",
        # /proc/PID/environ is the one of the last exec: until setsid has
        # exec'd, it lacks TFCLUSTER_TASK, and the task would look dead. The
        # pid file is written once it is there (or the process is gone).
        'n=0; until is_task "$p" ' + shlex.quote(task) + " || [ $n -ge 500 ] || "
        '! kill -0 "$p" 2>/dev/null; do sleep 0.01; n=$((n+1)); done',
        f'echo "$p $(start_tick "$p")" > {pid}',
        f'echo "started {task} $p"',
    ]


# The last lines of a task's log that a readiness poll reports.
OUTPUT_LINES = 20


def wait_ports(layout: NodeLayout, tasks: Mapping[str, int], timeout: float) -> str:
    """Wait until each task listens on its port, at most ``timeout``
    seconds; prints one line per task: ``ready NAME``, ``dead NAME`` (its
    process ended) or ``timeout NAME``; then, for each task still waited
    for, ``lines NAME N`` (its log's line count) and its last complete
    lines, each as ``@log NAME LINE``. The tasks are watched together and
    the wait ends at the first death: a job with a dead task will not start,
    so waiting for the others only delays the error."""
    names = sorted(tasks)
    lines = [_PRELUDE, "SECONDS=0"]
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
    lines = [_PRELUDE]
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
    lines = [_PRELUDE, "pids=''"]
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
    return "\n".join(lines)


def follow_log(layout: NodeLayout, task: str) -> str:
    """Print the task's log from the start and keep following it until the
    task's process ends (GNU tail --pid), then print its exit line."""
    log, pid, exit_file = _files(layout, task)
    return "\n".join(
        [
            _PRELUDE,
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
    return "\n".join([_PRELUDE, f"tail -n {int(lines)} {log} 2>/dev/null || true"])


def in_workdir(layout: NodeLayout, workdir: str, argv: Sequence[str]) -> str:
    """``argv`` in the working folder with the node environment's ``bin``
    first on PATH, stderr with stdout (``deploy.py exec``)."""
    return "\n".join(
        [
            _PRELUDE,
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
        _PRELUDE,
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


# nvidia-smi's query interface: one CSV line per GPU, units left out
# (memory.total in MiB, utilization.gpu in %), stable across driver versions
# (`nvidia-smi --help-query-gpu`), unlike its table.
GPU_FIELDS = ("name", "memory.total", "utilization.gpu")


def gpu_query() -> str:
    """The node's GPUs as ``nvidia-smi`` sees them: one ``NAME, MiB, %`` line
    per GPU; ``no nvidia-smi`` where it is not installed (no NVIDIA driver:
    a CPU node); what it printed and ``@nvidia-smi-exit N`` when it failed
    (a driver that does not load). Always exits 0: no GPU is an answer."""
    query = " ".join(
        [
            "nvidia-smi",
            "--query-gpu=" + ",".join(GPU_FIELDS),
            "--format=csv,noheader,nounits",
        ]
    )
    return (
        "if ! command -v nvidia-smi >/dev/null 2>&1; then echo 'no nvidia-smi'; exit 0; fi\n"
        f"{query} 2>&1\n"
        'c=$?; [ "$c" = 0 ] || echo "@nvidia-smi-exit $c"; exit 0'
    )


def cpu_count() -> str:
    """How many CPUs this node's processes may use (``deploy.py sweep``
    checks ``--per-node`` against it); prints ``cpus N``."""
    return 'echo "cpus $(nproc 2>/dev/null || getconf _NPROCESSORS_ONLN 2>/dev/null || echo -)"'


# -- what a node's image brings (setup) ---------------------------------------------------

# A Deep Learning VM image installs the NVIDIA driver on first boot (with
# metadata install-nvidia-driver=True), which may still run when setup
# starts; its images carry /opt/deeplearning.
DRIVER_WAIT_S = 300


def system_tensorflow(python: str) -> str:
    """The TensorFlow the node's own ``python`` has (a Deep Learning VM image
    with TensorFlow ships one): ``@tfcluster system-tensorflow VERSION``, or
    ``none``. See ``facts.parse_system_tensorflow``."""
    code = (
        "import importlib.metadata as m\n"
        "for d in ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu'):\n"
        "    try:\n"
        "        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
    )
    return (
        f"v=$({shlex.quote(python)} -c {shlex.quote(code)} 2>/dev/null | head -n 1)\n"
        'echo "@tfcluster system-tensorflow ${v:-none}"'
    )


def gpu_check(layout: NodeLayout, wait_s: int = DRIVER_WAIT_S) -> str:
    """Whether the NVIDIA driver works (waiting up to ``wait_s`` on a Deep
    Learning VM image, whose first boot installs it) and how many GPUs
    TensorFlow in the node's venv sees: ``@tfcluster driver yes|no`` and
    ``@tfcluster tf-gpus N``. See ``facts.parse_gpu_check``."""
    code = (
        "import tensorflow as tf\n"
        "print('@tfcluster tf-gpus', len(tf.config.list_physical_devices('GPU')))\n"
    )
    return "\n".join(
        [
            'export H="$PWD"',
            "ok() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }",
            "if [ -d /opt/deeplearning ]; then",
            f"  n=0; while ! ok && [ $n -lt {int(wait_s)} ]; do sleep 5; n=$((n + 5)); done",
            "fi",
            "if ok; then echo '@tfcluster driver yes'; else echo '@tfcluster driver no'; fi",
            f"{path(layout.python)} -c {shlex.quote(code)} || echo '@tfcluster tf-gpus error'",
        ]
    )


# -- autostop (infra/autostop.py) ------------------------------------------------------
#
# The watcher decides "idle" with alive_pid over every pid file of the logs
# folder: the very test the orchestrator uses for a job's tasks, so the two
# never disagree. `exec` writes a pid file there too (in_workdir), so a long
# `exec -- python eval.py` keeps the node up as a job does.

_SCAN = (
    'tfc_busy() { local f b=0; for f in "$1"/*.pid; do [ -e "$f" ] || continue; '
    'if [ -n "$(alive_pid "$f")" ]; then b=$((b+1)); '
    'else case "${f##*/}" in exec-*) rm -f "$f";; esac; fi; done; echo $b; }'
)
_UNIT = "tfcluster-autostop"


def _autostop_dir(layout: NodeLayout) -> str:
    return f"{layout.root.rstrip('/')}/autostop"


def autostop_script(layout: NodeLayout, check_every: int) -> str:
    """The watcher: a bash loop that powers the guest off once no task has
    run on this node for ``autostop/after`` seconds. Its idle clock is the
    mtime of ``autostop/active``, touched while a task runs, when the
    setting changes, and when the watcher starts (a boot, a `start`): a
    node that was just started is not stopped at once for its idle past."""
    d = path(_autostop_dir(layout))
    logs = path(layout.logs)
    return "\n".join(
        [
            "#!/bin/bash",
            "# tfcluster's autostop watcher, written by `deploy.py up/autostop`",
            "# (infra/autostop.py). Edits are overwritten.",
            'cd "$HOME" || exit 1',
            _PRELUDE,
            _SCAN,
            f"touch {d}/active",
            "while :; do",
            f'  [ "$(tfc_busy {logs})" = 0 ] || touch {d}/active',
            f"  a=$(cat {d}/after 2>/dev/null)",
            '  case "$a" in ""|*[!0-9]*) a=0;; esac',
            f"  i=$(( $(date +%s) - $(stat -c %Y {d}/active 2>/dev/null || date +%s) ))",
            # Looked at again right before: a job started meanwhile wins.
            f'  if [ "$a" -gt 0 ] && [ "$i" -ge "$a" ] && [ "$(tfc_busy {logs})" = 0 ]; then',
            f'    echo "$(date -u +%FT%TZ) idle ${{i}}s >= ${{a}}s: powering off" >> {d}/watch.log',
            # A VM (systemd): a clean poweroff, which GCE records as TERMINATED.
            # A container (no init system): its PID 1 (sshd) ends, and with it
            # the container, which the fake GCE records as TERMINATED.
            "    if [ -d /run/systemd/system ]; then sudo -n systemctl poweroff; "
            "else sudo -n kill -TERM 1; fi",
            "    sleep 60",
            "  fi",
            f"  sleep {int(check_every)}",
            "done",
        ]
    )


def _autostop_report(layout: NodeLayout) -> list[str]:
    """Lines that print ``autostop AFTER IDLE BUSY WATCHING CONFIGURED``."""
    d = path(_autostop_dir(layout))
    return [
        _SCAN,
        f"a=$(cat {d}/after 2>/dev/null); c=0; [ -e {d}/after ] && c=1",
        f"b=$(tfc_busy {path(layout.logs)})",
        f"i=$(( $(date +%s) - $(stat -c %Y {d}/active 2>/dev/null || date +%s) ))",
        '[ "$b" = 0 ] || i=0',
        f"w=0; if systemctl is-active --quiet {_UNIT} 2>/dev/null || "
        f'[ -n "$(alive_pid {d}/watcher.pid)" ]; then w=1; fi',
        'echo "autostop ${a:-off} $i $b $w $c"',
    ]


def autostop_status(layout: NodeLayout) -> str:
    """What the node's watcher holds and sees (``facts.parse_autostop``)."""
    return "\n".join([_PRELUDE, *_autostop_report(layout)])


def autostop_apply(
    layout: NodeLayout, after_s: int | None, *, keep: bool, check_every: int
) -> str:
    """Set the node's autostop (``after_s`` seconds, None: off) or, with
    ``keep``, leave the setting it has; then make sure its watcher runs.
    Idempotent: the script is rewritten (atomically: a running bash reads
    its script as it goes) and the watcher restarted.

    How the watcher survives a reboot: under systemd (a GCE VM) it is a
    system unit, enabled, so it starts at every boot, however the VM was
    started. Without an init system (the test containers, whose PID 1 is
    sshd) there is nothing that runs at boot: it is a setsid'd loop, and
    `up` and `start` (which every restart of a node goes through) run this
    command again. Prints what ``autostop_status`` prints."""
    d = path(_autostop_dir(layout))
    lines = [_PRELUDE, f"mkdir -p {d}"]
    if keep:
        # Autostop never used on this node: nothing to watch.
        lines.append(f'[ -e {d}/after ] || {{ echo "autostop off 0 0 0 0"; exit 0; }}')
    else:
        value = str(int(after_s)) if after_s else "0"
        lines.append(f"echo {value} > {d}/after.tmp && mv -f {d}/after.tmp {d}/after")
    script = autostop_script(layout, check_every)
    lines += [
        f"cat > {d}/watch.sh.tmp <<'TFCLUSTER_AUTOSTOP_EOF'",
        script,
        "TFCLUSTER_AUTOSTOP_EOF",
        f"mv -f {d}/watch.sh.tmp {d}/watch.sh",
        # A new setting (or a restarted watcher) starts the idle clock again.
        f"touch {d}/active",
        "if [ -d /run/systemd/system ] && sudo -n true 2>/dev/null; then",
        f"  printf '%s\\n' '[Unit]' 'Description=tfcluster autostop' '[Service]' "
        f'"User=$(id -un)" "WorkingDirectory=$H" "ExecStart=/bin/bash "{d}/watch.sh '
        f"'Restart=always' '[Install]' 'WantedBy=multi-user.target' "
        f"| sudo -n tee /etc/systemd/system/{_UNIT}.service >/dev/null",
        f"  sudo -n systemctl daemon-reload && sudo -n systemctl enable --quiet {_UNIT} "
        f"&& sudo -n systemctl restart {_UNIT}",
        "else",
        f'  p=$(alive_pid {d}/watcher.pid); [ -z "$p" ] || kill "$p" 2>/dev/null',
        f"  setsid env TFCLUSTER_TASK=watcher nohup bash {d}/watch.sh >> {d}/watch.log 2>&1 "
        "< /dev/null &",
        "  p=$!",
        '  n=0; until is_task "$p" watcher || [ $n -ge 500 ] || ! kill -0 "$p" 2>/dev/null; '
        "do sleep 0.01; n=$((n+1)); done",
        f'  echo "$p $(start_tick "$p")" > {d}/watcher.pid',
        "fi",
        *_autostop_report(layout),
    ]
    return "\n".join(lines)


def file_exists(p: str) -> str:
    """Prints ``yes`` when the file ``p`` (a layout path) exists."""
    return "\n".join([_PRELUDE, f"if [ -e {path(p)} ]; then echo yes; else echo no; fi"])


def autostop_touch(layout: NodeLayout) -> str:
    """Start the node's autostop idle clock again (a job is being launched:
    its sync may take longer than a short autostop); nothing where
    autostop was never set."""
    d = path(_autostop_dir(layout))
    return "\n".join([_PRELUDE, f"if [ -e {d}/after ]; then touch {d}/active; fi"])
