"""The wrapper every task runs in, and its watchdog: a task that ends when
its job is over, with no command of the operator's attached.

A job ends when its chief ends. An attached ``train``/``run`` then stops
the other tasks itself; but after ``--detach``, a closed laptop or a lost
connection nobody does, and a ps blocks in ``server.join()`` for ever: its
pid file keeps the node busy, so autostop never stops it. So every task
but the chief is started with a *watch* (``Watch``): a small bash loop in
the task's own wrapper (``WRAPPER``, started by ``commands.start_task``)
that ends the task once the chief has ended, node-side. Three kinds:

- ``pid``: the chief's pid file can be read from where the task runs (the
  chief's own node; on the local cluster every node is a folder of this
  machine). The chief is *this job's* once its pid file no longer holds
  what it held before the task started (the start script reads it first,
  and starts the chief's node's other tasks before the chief), or once the
  process it names (pid *and* start tick: after a reboot a task of this
  very job may have the pid of the last boot's chief) carries this job's
  ``TFCLUSTER_RUN_ID``. It has ended
  when that process (pid *and* start tick, as ``alive_pid``) is gone, two
  looks in a row, a second apart. Works whatever the chief runs.
- ``tcp``: the chief is on another machine. The only way there that exists
  already (GCE opens nothing but the TensorFlow ports between nodes; no
  new port is opened for this) is the chief's own TF_CONFIG port, on which
  every mode of the built-in trainer, and a user's chief under
  ParameterServerStrategy or MultiWorkerMirroredStrategy, runs a TensorFlow
  server. A connect to it every second (bash ``/dev/tcp``: a fork, no
  exec, no byte sent): once it has been answered, four failures in a row
  (refused, unreachable, or no answer within 1 s) mean the chief is gone.
  Limits: a chief that never listens (a program whose chief uses no
  TensorFlow distribution), or that ends within about a second of
  listening, is never seen; then its tasks on other nodes run until the
  next ``train``/``run``/``sweep``/``cancel`` stops them, as before this
  watch existed (the chief's own node, and the whole local cluster, use
  ``pid``). A chief unreachable from a task's node for 4 s (a network cut
  that long) is taken for gone, and that task ends: an async job goes on
  without a worker, not without its ps.
- ``lease``: a file holding the node's clock (epoch seconds) that the
  operator's command renews while it is attached (``deploy.py
  tensorboard``); older than the lease, the task ends. So TensorBoard,
  which autostop counts as busy, never outlives the tunnel that shows it
  by more than that.

Ending is the same for all: one line in the task's log, the autostop idle
clock started (``<autostop>/active``: the node is idle from now), SIGTERM to
the task's process group, 5 s for it to go, then SIGKILL. The watchdog is a
member of that very group (a child of the wrapper, itself the group's
leader by setsid), so the group it signals is its own task's by
construction: a group id cannot be reused while one of its processes
lives, and a pid file plays no part. It dies with its task: the wrapper
kills it when the program ends, ``stop_tasks``'s SIGTERM to the group
reaches it, and it leaves by itself when the wrapper is gone. It detaches
with the task (same session, no terminal, stdin from /dev/null), so it
outlives the SSH channel that started it. Between looks it sleeps in bash's
own ``read -t`` on a pipe nobody writes: no ``sleep`` process per second.

Everything the wrapper is given arrives as positional words, never as
shell text: the wrapper is one fixed script.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from infra.spec.tfconfig import TaskSpec
    from infra.transport.base import Transport

# Looks in a row that must find the chief gone, per kind (one a second).
PID_MISSES = 2
TCP_MISSES = 4
# How long the task's group gets after SIGTERM before SIGKILL, in tenths
# of a second. Detection (at most ~4 s) plus this stays within 10 s.
GRACE_TENTHS = 50


@dataclass(frozen=True)
class Watch:
    """What ends a task besides its own end (see the module docstring).

    ``kind`` ``pid``: ``target`` is the chief's pid file (a layout path, or
    absolute), ``value`` the job's run id. ``tcp``: ``target`` the chief's
    address, ``value`` its port. ``lease``: ``target`` the lease file,
    ``value`` its seconds."""

    kind: Literal["pid", "tcp", "lease"]
    target: str
    value: str

    @classmethod
    def chief_pid(cls, pid_file: str, run_id: str) -> Watch:
        return cls("pid", pid_file, run_id)

    @classmethod
    def chief_port(cls, host: str, port: int) -> Watch:
        return cls("tcp", host, str(int(port)))

    @classmethod
    def lease(cls, lease_file: str, seconds: int) -> Watch:
        return cls("lease", lease_file, str(int(seconds)))


# $0: the task's name (bash puts it before its own errors); $1: its exit
# file; $2: the node's autostop folder; $3..$6: the watch (kind, three
# values; all empty for none); then the program's argv. The user's variables
# are in this shell's environment: every name it uses is set before use.
_WRAPPER = r"""
tfc_exit=$1 tfc_idle=$2 tfc_w= tfc_q= tfc_tick=
tfc_stat() {  # $1 runs (not a zombie); its start tick in tfc_tick
  local s; read -r s 2>/dev/null < "/proc/$1/stat" || return 1
  s=${s##*) }; set -- $s; [ "$1" != Z ] && tfc_tick=${20}
}
tfc_has() {  # process $1's environment holds the entry $2
  local e
  while IFS= read -r -d '' e; do [ "$e" = "$2" ] && return 0; done 2>/dev/null < "/proc/$1/environ"
  return 1
}
tfc_others() {  # a process of this task's group runs, besides this one
  local f s
  for f in /proc/[0-9]*/stat; do
    read -r s 2>/dev/null < "$f" || continue; s=${s##*) }; set -- $s
    [ "$3" = "$$" ] && [ "$1" != Z ] && [ "$f" != "/proc/$BASHPID/stat" ] && return 0
  done
  return 1
}
tfc_idle_now() { [ ! -d "$tfc_idle" ] || touch "$tfc_idle/active" 2>/dev/null; }
tfc_end() {
  echo "tfcluster: $1; stopping $0" >&2
  trap '' TERM; tfc_idle_now; kill -TERM -- "-$$" 2>/dev/null
  local n=0
  while tfc_others && [ $n -lt @GRACE@ ]; do read -rt 0.1 -u "$tfc_s"; n=$((n + 1)); done
  kill -KILL -- "-$$" 2>/dev/null; exit 0
}
tfc_gone() {  # one more look found the chief gone; $1 looks in a row end the task
  miss=$((miss + 1)); [ $miss -lt "$1" ] || tfc_end "$2"
}
tfc_watch() {
  local kind=$1 a=$2 b=$3 c=$4 armed=0 miss=0 p t r l now
  exec {tfc_s}<> <(:)
  trap '[ -z "$tfc_q" ] || kill "$tfc_q" 2>/dev/null; exit 0' TERM
  while tfc_stat "$$"; do
    case $kind in
    pid)
      p= t=; read -r p t 2>/dev/null < "$a"
      if [ $armed = 0 ] && [ -n "$p" ]; then
        { [ "$p $t" != "$b" ] || { tfc_stat "$p" && [ "$tfc_tick" = "$t" ] &&
          tfc_has "$p" "TFCLUSTER_RUN_ID=$c"; }; } && armed=1
      fi
      if [ $armed = 1 ]; then
        if [ -n "$t" ] && tfc_stat "$p" && [ "$tfc_tick" = "$t" ]; then miss=0
        else tfc_gone @PID_MISSES@ "the chief ended"; fi
      fi
      read -rt 1 -u "$tfc_s" ;;
    tcp)
      ( : <>"/dev/tcp/$a/$b" ) 2>/dev/null & tfc_q=$!
      read -rt 1 -u "$tfc_s"
      if tfc_stat "$tfc_q"; then kill "$tfc_q" 2>/dev/null; wait "$tfc_q"; r=1
      else wait "$tfc_q"; r=$?; fi
      tfc_q=
      if [ $r = 0 ]; then armed=1 miss=0
      elif [ $armed = 1 ]; then tfc_gone @TCP_MISSES@ "the chief at $a:$b stopped answering"; fi ;;
    lease)
      l=; read -r l 2>/dev/null < "$a"; printf -v now '%(%s)T' -1
      case $l in ''|*[!0-9]*) l=0;; esac
      [ $((now - l)) -le "$b" ] || tfc_end "its lease ran out (not renewed for $b s)"
      read -rt 1 -u "$tfc_s" ;;
    *) return ;;
    esac
  done
}
if [ -n "$3" ]; then tfc_watch "$3" "$4" "$5" "$6" & tfc_w=$!; fi
shift 6
"$@"
tfc_c=$?
[ -z "$tfc_w" ] || kill "$tfc_w" 2>/dev/null
echo "$tfc_c" > "$tfc_exit"
tfc_idle_now
"""
WRAPPER = (
    _WRAPPER.replace("@GRACE@", str(GRACE_TENTHS))
    .replace("@PID_MISSES@", str(PID_MISSES))
    .replace("@TCP_MISSES@", str(TCP_MISSES))
)


def watch_words(watch: Watch | None, path_word: str, snapshot_var: str) -> list[str]:
    """The wrapper's four watch words (``$3..$6``). ``path_word`` is the
    watch's file as a bash word (``commands.path``); ``snapshot_var`` the
    start script's variable holding the chief's pid file as it was."""
    if watch is None:
        return ["''"] * 4
    if watch.kind == "pid":
        return ["pid", path_word, f'"${snapshot_var}"', shlex.quote(watch.value)]
    if watch.kind == "tcp":
        return ["tcp", shlex.quote(watch.target), shlex.quote(watch.value), "''"]
    return ["lease", path_word, shlex.quote(watch.value), "''"]


def renew_lease(path_word: str) -> str:
    """Bash that writes the node's clock into the lease file (``path_word``,
    a bash word) atomically: the watch never reads half a number."""
    return (
        f"printf '%(%s)T\\n' -1 > {path_word}.tmp 2>/dev/null && mv -f {path_word}.tmp {path_word}"
    )


def wrapper_argv(
    task: str, exit_word: str, idle_word: str, watch: Sequence[str], argv: Sequence[str]
) -> list[str]:
    """``bash -c WRAPPER`` and its words, each a bash word."""
    return [
        "bash",
        "-c",
        shlex.quote(WRAPPER),
        shlex.quote(task),
        exit_word,
        idle_word,
        *watch,
        *(shlex.quote(a) for a in argv),
    ]


def task_watch(transport: Transport, chief: TaskSpec, task: TaskSpec, run_id: str) -> Watch:
    """What ends ``task`` once ``chief`` (of job ``run_id``) has ended: the
    chief's pid file where ``task``'s node can read it (the chief's own
    node, or nodes that are all folders of this machine: the local
    cluster), else the chief's TF port."""
    pid_file = f"{transport.layout(chief.node).logs.rstrip('/')}/{chief.name}.pid"
    if task.node == chief.node:
        return Watch.chief_pid(pid_file, run_id)
    here = transport.local_folder(task.node)
    there = transport.local_folder(chief.node)
    if here is not None and there is not None:
        absolute = pid_file if pid_file.startswith("/") else str(there / pid_file)
        return Watch.chief_pid(absolute, run_id)
    return Watch.chief_port(chief.host, chief.port)
