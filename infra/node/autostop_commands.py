"""Shell commands of autostop (infra/cluster/autostop.py): the watcher a node runs,
what it reports, and the busy marks the operator's commands hold.

Pure functions from a ``NodeLayout`` to bash text, as ``infra/node/commands.py``
(whose prelude they use); ``facts.parse_autostop`` parses the report.

A node is *busy* while any of these holds, and idle from the moment the
last one ended (each end touches ``<autostop>/active``, the idle clock):

- a task runs: a pid file of the logs folder (a job's tasks, a sweep's
  trials, ``exec``'s command) or of TensorBoard's folder names a live
  process, by ``alive_pid``: the very test the orchestrator uses, so the
  two never disagree. A task ends by itself, when ``stop_tasks`` stops it,
  or when its watch (infra/node/watchdog.py) sees its chief gone;
- the operator's command works on the node: install, sync (with the
  working folder's requirements.txt), the end-of-job fetch, ``exec``'s and
  ``sweep``'s sync, a launch. Those run over SSH, not as node processes,
  so the command holds a *busy mark* instead (``busy_mark``): a file of
  ``<autostop>/busy/`` holding the node's clock, renewed while the command
  works and removed when it is done. A mark older than ``BUSY_LEASE_S``
  (its command died: a closed laptop) no longer counts, and is removed.
"""

from __future__ import annotations

import shlex

from infra.node.commands import PRELUDE, autostop_dir, board_layout, path
from infra.transport.base import NodeLayout

# A busy mark counts this long after its last renewal (its holder renews
# it every BUSY_RENEW_S: infra/cluster/autostop.py).
BUSY_LEASE_S = 60

# tfc_busy LOGS BOARD MARKS LEASE: how many things keep the node busy. A
# dead exec's pid file and a stale mark are removed on the way.
_SCAN = (
    "tfc_busy() { local f b=0 t now; printf -v now '%(%s)T' -1; "
    'for f in "$1"/*.pid "$2"/*.pid; do [ -e "$f" ] || continue; '
    'if [ -n "$(alive_pid "$f")" ]; then b=$((b+1)); '
    'else case "${f##*/}" in exec-*) rm -f "$f";; esac; fi; done; '
    'for f in "$3"/*; do [ -f "$f" ] || continue; t=; read -r t 2>/dev/null < "$f"; '
    'case "$t" in ""|*[!0-9]*) t=0;; esac; '
    'if [ $((now - t)) -le "$4" ]; then b=$((b+1)); else rm -f "$f"; fi; done; echo $b; }'
)
_UNIT = "tfcluster-autostop"


def _busy_args(layout: NodeLayout) -> str:
    """The words of ``tfc_busy`` for this layout."""
    marks = f"{autostop_dir(layout)}/busy"
    board = board_layout(layout).logs
    return f"{path(layout.logs)} {path(board)} {path(marks)} {BUSY_LEASE_S}"


def autostop_script(layout: NodeLayout, check_every: int) -> str:
    """The watcher: a bash loop that powers the guest off once nothing has
    kept this node busy for ``autostop/after`` seconds. Its idle clock is
    the mtime of ``autostop/active``, touched while the node is busy, when
    a task or a busy mark ends, when the setting changes, and when the
    watcher starts (a boot, a `start`): a node that was just started is
    not stopped at once for its idle past."""
    d = path(autostop_dir(layout))
    busy = _busy_args(layout)
    return "\n".join(
        [
            "#!/bin/bash",
            "# tfcluster's autostop watcher, written by `deploy.py up/autostop`",
            "# (infra/cluster/autostop.py). Edits are overwritten.",
            'cd "$HOME" || exit 1',
            PRELUDE,
            _SCAN,
            f"touch {d}/active",
            "while :; do",
            f'  [ "$(tfc_busy {busy})" = 0 ] || touch {d}/active',
            f"  a=$(cat {d}/after 2>/dev/null)",
            '  case "$a" in ""|*[!0-9]*) a=0;; esac',
            f"  i=$(( $(date +%s) - $(stat -c %Y {d}/active 2>/dev/null || date +%s) ))",
            # Looked at again right before: a job started meanwhile wins.
            f'  if [ "$a" -gt 0 ] && [ "$i" -ge "$a" ] && [ "$(tfc_busy {busy})" = 0 ]; then',
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
    d = path(autostop_dir(layout))
    return [
        _SCAN,
        f"a=$(cat {d}/after 2>/dev/null); c=0; [ -e {d}/after ] && c=1",
        f"b=$(tfc_busy {_busy_args(layout)})",
        f"i=$(( $(date +%s) - $(stat -c %Y {d}/active 2>/dev/null || date +%s) ))",
        '[ "$b" = 0 ] || i=0',
        f"w=0; if systemctl is-active --quiet {_UNIT} 2>/dev/null || "
        f'[ -n "$(alive_pid {d}/watcher.pid)" ]; then w=1; fi',
        'echo "autostop ${a:-off} $i $b $w $c"',
    ]


def autostop_status(layout: NodeLayout) -> str:
    """What the node's watcher holds and sees (``facts.parse_autostop``)."""
    return "\n".join([PRELUDE, *_autostop_report(layout)])


def autostop_apply(layout: NodeLayout, after_s: int | None, *, keep: bool, check_every: int) -> str:
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
    d = path(autostop_dir(layout))
    lines = [PRELUDE, f"mkdir -p {d}"]
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


def busy_mark(layout: NodeLayout, name: str) -> str:
    """Mark the node busy as ``name`` (written again: renewed) and start its
    idle clock again; nothing where autostop was never set (no watcher to
    tell). The mark holds the node's own clock, written atomically."""
    d = path(autostop_dir(layout))
    mark = f"{d}/busy/{shlex.quote(name)}"
    return "\n".join(
        [
            PRELUDE,
            f"[ -d {d} ] || exit 0",
            f"mkdir -p {d}/busy && printf '%(%s)T\\n' -1 > {mark}.tmp && mv -f {mark}.tmp {mark}",
            f"touch {d}/active",
        ]
    )


def busy_clear(layout: NodeLayout, name: str) -> str:
    """The busy mark ``name`` removed; the node is idle from now (if
    nothing else keeps it busy)."""
    d = path(autostop_dir(layout))
    return "\n".join(
        [
            PRELUDE,
            f"[ -d {d} ] || exit 0",
            f"rm -f {d}/busy/{shlex.quote(name)}",
            f"touch {d}/active",
        ]
    )
