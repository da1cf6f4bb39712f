"""How an error reaches the user: an expected one (``TfclusterError``) as
one red line, its details and hint, and its exit code; anything else (a
bug) as one line naming the debug log that holds its traceback.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path

import click

from infra.errors import TfclusterError
from infra.state.folder import tfcluster_home
from infra.text import node_text
from tfcluster_cli import consoles

EXIT_BUG = 70  # EX_SOFTWARE: not the user's fault; the debug log says why


def fail(exc: TfclusterError) -> None:
    for line in getattr(exc, "details", ()):
        consoles.err_console.print(
            node_text(str(line)), markup=False, highlight=False, soft_wrap=True, style="dim"
        )
    # Messages carry names from configs and nodes: data, never markup, and
    # a node's stderr in them must not drive the terminal.
    for line in [str(exc), *getattr(exc, "more", ())]:
        consoles.err_console.print(
            f"error: {consoles.as_invoked(node_text(line))}",
            style="red", markup=False, soft_wrap=True,
        )  # fmt: skip
    if exc.hint:
        consoles.err_console.print(
            f"hint: {consoles.as_invoked(node_text(exc.hint))}",
            style="dim", markup=False, soft_wrap=True,
        )  # fmt: skip
    raise click.exceptions.Exit(exc.exit_code)


def write_debug_log() -> Path:
    path = tfcluster_home() / "debug.log"
    # A traceback can hold paths and config values: this user's eyes only.
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    os.fchmod(fd, 0o600)  # also a log an older version left 0644
    with os.fdopen(fd, "a") as out:
        out.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(sys.argv)}\n")
        out.write(traceback.format_exc())
    return path
