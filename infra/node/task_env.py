"""A task's environment: tfcluster's own values on its command line, the
user's through a file only the user can read.

A process's command line (``/proc/PID/cmdline``, ``ps``) is readable by
every user of a machine; its environment (``/proc/PID/environ``) only by
its own user. So the values a user gives (``--env``, ``job.env``: tokens,
keys) never travel in a command: ``put`` writes them into a file on the
node (``<root>/env/<name>.env``, 0600 in a 0700 folder, written to a
temporary name and renamed: ``Transport.write_private``), and the start
script exports them into the task's environment just before it becomes the
task (``commands.start_task``'s ``env_file``). What tfcluster sets itself
(TF_CONFIG, TFCLUSTER_*, its defaults) stays on the command line: it
differs per task and holds nothing secret.

The file is removed once no longer needed: a job's start script removes it
when it ends (``commands.remove_on_exit``: every task it started has its
environment by then); a sweep, which starts trials for as long as it runs,
removes it at its end (``forget``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

from infra.errors import RemoteError
from infra.node import commands
from infra.transport.base import NodeLayout, Transport

# Set for every task unless the user's values say otherwise.
DEFAULTS = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


def split(private: Mapping[str, str], own: Mapping[str, str]) -> dict[str, str]:
    """The values for a task's command line: the defaults the user's
    ``private`` values do not set, then tfcluster's ``own`` (which win over
    both, as they did when everything was on the command line)."""
    public = {k: v for k, v in DEFAULTS.items() if k not in private}
    public.update(own)
    return public


def env_file(layout: NodeLayout, name: str) -> str:
    """Where the user's values for ``name`` (a run or sweep id) go on a
    node, as a layout path."""
    return f"{layout.root.rstrip('/')}/env/{name}.env"


def payload(values: Mapping[str, str]) -> bytes:
    """``NAME=value`` records, each ended by a NUL byte: a value may hold
    any text (quotes, newlines, ``$(...)``), never a NUL (no environment
    value can), and bash's ``mapfile -d ''`` reads it back literally."""
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in sorted(values.items()))


def put(transport: Transport, node: str, name: str, values: Mapping[str, str]) -> str | None:
    """Write the user's ``values`` for ``name`` on ``node``; the layout path
    to give ``start_task`` as ``env_file``, None when there are none (no
    file, no round trip)."""
    if not values:
        return None
    target = env_file(transport.layout(node), name)
    transport.write_private(node, target, payload(values))
    return target


def forget(transport: Transport, nodes: list[str], name: str) -> None:
    """Remove ``name``'s file from these nodes; one that cannot be reached
    keeps it (0600, in a 0700 folder) until the next start of that name
    replaces it."""
    scripts = {
        n: "\n".join(
            [commands.PRELUDE, f"rm -f -- {commands.path(env_file(transport.layout(n), name))}"]
        )
        for n in nodes
    }
    with contextlib.suppress(RemoteError):
        transport.run_all(scripts, timeout=30)
