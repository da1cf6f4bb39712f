"""Shell commands for the node's uploader (infra/storage/uploader.py), and
the parser of what they print (as infra/node/commands.py and infra/node/facts.py,
side by side: one concept, a few lines each).

The uploader is a task like a job's (``commands.start_task``: setsid,
a pid file with its start tick, TFCLUSTER_TASK), named
``upload-<run id>``, with its state in ``<logs>/upload-<run id>.json``.
It is not one of the job's tasks: a job's stop leaves it to finish, and
it ends by itself once the task it watches has ended and its last upload
is done. Autostop's watcher counts its pid file like any task's, so a
node never powers off under an upload.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from infra.node import commands
from infra.node.commands import path
from infra.transport.base import NodeLayout

PREFIX = "upload-"
_LINE = "@tfcluster-upload"


def task_name(run_id: str) -> str:
    return f"{PREFIX}{run_id}"


def start_uploader(
    layout: NodeLayout,
    *,
    run_id: str,
    run_dir: str,
    watch_task: str,
    url: str,
    endpoint: str | None,
    credentials: str,
    record: Mapping[str, Any],
) -> str:
    """Start the uploader of ``run_dir`` (a layout path) to ``url``, until
    ``watch_task`` ends; prints ``started upload-<run id> PID``."""
    logs = layout.logs.rstrip("/")
    name = task_name(run_id)
    argv = [
        "python", "-m", "infra.storage.uploader",
        *(["--endpoint", endpoint] if endpoint else []),
        "--credentials", credentials,
        "upload",
        "--run-dir", run_dir,
        "--url", url,
        "--watch", f"{logs}/{watch_task}.pid",
        "--exit-file", f"{logs}/{watch_task}.exit",
        "--status", f"{logs}/{name}.json",
        "--record", json.dumps(dict(record), sort_keys=True),
    ]  # fmt: skip
    return commands.start_task(
        layout, name, argv, {"PYTHONUNBUFFERED": "1"}, path_env={"PYTHONPATH": layout.code}
    )


def uploads(layout: NodeLayout, wait_s: float = 0.0, run_id: str | None = None) -> str:
    """Wait up to ``wait_s`` seconds until no uploader (or only not the one
    of ``run_id``) runs on the node, then print ``@tfcluster-upload NAME
    ALIVE STATUS-JSON`` per uploader that runs or left a state file."""
    logs = path(layout.logs)
    which = shlex.quote(task_name(run_id)) + ".pid" if run_id else PREFIX + "*.pid"
    return "\n".join(
        [
            commands.PRELUDE,
            f"cd {logs} 2>/dev/null || exit 0",
            f"busy() {{ local f; for f in {which}; do [ -e \"$f\" ] || continue; "
            '[ -n "$(alive_pid "$f")" ] && return 0; done; return 1; }',
            f"SECONDS=0; while busy && [ $SECONDS -lt {int(wait_s)} ]; do sleep 0.5; done",
            # Every uploader that runs (one just started has no state yet)
            # or left a state.
            "for n in $(ls " + PREFIX + "*.pid " + PREFIX + "*.json 2>/dev/null "
            "| sed 's/\\.[a-z]*$//' | sort -u); do "
            'a=0; [ -n "$(alive_pid "$n.pid")" ] && a=1; '
            f'printf "%s %s %s " {_LINE} "$n" "$a"; '
            'if [ -e "$n.json" ]; then tr -d "\\n" < "$n.json"; else printf "{}"; fi; echo; done',
        ]
    )


def restore(
    layout: NodeLayout, *, run_dir: str, url: str, endpoint: str | None, credentials: str
) -> str:
    """The run's checkpoints from ``url`` into ``run_dir`` (a layout path),
    unless it holds a checkpoint index already; prints ``@tfcluster
    restored N`` (0: there already)."""
    d = path(run_dir)
    argv = [
        "python", "-m", "infra.storage.uploader",
        *(["--endpoint", endpoint] if endpoint else []),
        "--credentials", credentials,
        "restore", "--url", url, "--dest",
    ]  # fmt: skip
    return "\n".join(
        [
            'export H="$PWD"',
            f"if [ -e {d}/checkpoints/checkpoint ]; then echo '@tfcluster restored 0'; exit 0; fi",
            f'export PATH={path(layout.bin)}:"$PATH"',
            f"PYTHONPATH={path(layout.code)} {' '.join(shlex.quote(a) for a in argv)} {d}",
        ]
    )


def stage_data(
    layout: NodeLayout, *, url: str, dest: str, endpoint: str | None, credentials: str
) -> str:
    """The data folder at ``url`` into ``dest`` (a layout path, the node's
    cache) unless it is there already, unchanged (the uploader's ``data``
    keeps the generations it copied, and holds a lock while it copies)."""
    argv = [
        "python", "-m", "infra.storage.uploader",
        *(["--endpoint", endpoint] if endpoint else []),
        "--credentials", credentials,
        "data", "--url", url, "--dest",
    ]  # fmt: skip
    return "\n".join(
        [
            'export H="$PWD"',
            f'export PATH={path(layout.bin)}:"$PATH"',
            f"PYTHONPATH={path(layout.code)} {' '.join(shlex.quote(a) for a in argv)} "
            f"{path(dest)}",
        ]
    )


def parse_restored(stdout: str) -> int | None:
    """How many files ``restore`` brought; None when it did not say."""
    for line in stdout.splitlines():
        words = line.split()
        if words[:2] == ["@tfcluster", "restored"] and len(words) == 3 and words[2].isdigit():
            return int(words[2])
    return None


@dataclass(frozen=True)
class UploadState:
    """One uploader as its node reports it."""

    run_id: str
    alive: bool
    url: str
    uploaded: int
    bytes: int
    pending: tuple[str, ...]
    pending_count: int
    failed: dict[str, str]
    done: bool
    error: str = ""  # why it could not start (unusable credentials on the node)


# A count of files or bytes, as the uploader writes it; anything else (a
# node's text: JSON's 1e999 is infinity, a 400-digit number no float) is
# no state.
MAX_COUNT = 10**15


def _count(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
        raise ValueError("not a count")
    return value


def parse_uploads(stdout: str) -> list[UploadState]:
    """The ``@tfcluster-upload`` lines of ``uploads``; a line that does
    not parse (a torn state file, text from elsewhere, a count that is
    not one) is skipped."""
    out = []
    for line in stdout.splitlines():
        words = line.split(" ", 3)
        if len(words) != 4 or words[0] != _LINE or not words[1].startswith(PREFIX):
            continue
        try:
            data = json.loads(words[3])
            failed = data.get("failed") or {}
            out.append(
                UploadState(
                    run_id=words[1][len(PREFIX) :],
                    alive=words[2] == "1",
                    url=str(data.get("url") or ""),
                    uploaded=_count(data.get("uploaded")),
                    bytes=_count(data.get("bytes")),
                    pending=tuple(str(p) for p in data.get("pending") or ()),
                    pending_count=_count(data.get("pending_count")),
                    failed={str(k): str(v) for k, v in failed.items()},
                    done=bool(data.get("done")),
                    error=str(data.get("error") or "")[:300],
                )
            )
        except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
            continue
    return out


@dataclass(frozen=True)
class BucketOutcome:
    """What a job's uploader put in the bucket."""

    url: str
    files: int
    bytes: int
    pending: tuple[str, ...]
    failed: dict[str, str]
    done: bool
    error: str = ""

    def text(self) -> str:
        if self.error:
            return f"not in the bucket: the upload to {self.url} could not start: {self.error}"
        size = f"{self.bytes / 1e6:.1f} MB" if self.bytes >= 100_000 else f"{self.bytes} bytes"
        line = f"in the bucket: {self.url}/ ({self.files} files, {size})"
        if not self.done:
            line += "; still uploading (`deploy.py down` and `stop` wait for it)"
        elif self.failed:
            line += f"; not uploaded: {', '.join(sorted(self.failed)[:5])}"
        return line
