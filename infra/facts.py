"""Parsers for what the commands of ``infra/commands.py`` print.

Kept apart from the commands (as pyinfra's facts are) so each parser is
tested on recorded output, with no node needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

EXIT_MARKER = "@tfcluster-exit "


@dataclass(frozen=True)
class TaskStatus:
    name: str
    pid: int | None
    alive: bool
    exit_code: int | None  # None while running, or when it never wrote one


def parse_started(stdout: str) -> int | None:
    """``started 1234`` -> 1234."""
    match = re.search(r"^started (\d+)$", stdout, re.MULTILINE)
    return int(match.group(1)) if match else None


def parse_readiness(stdout: str) -> dict[str, str]:
    """``ready ps-0`` / ``dead worker-1`` / ``timeout chief-0`` lines."""
    result: dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("ready", "dead", "timeout"):
            result[parts[1]] = parts[0]
    return result


def parse_task_status(stdout: str) -> dict[str, TaskStatus]:
    """``NAME PID ALIVE EXIT`` lines, ``-`` for unknown."""
    result: dict[str, TaskStatus] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 4 or parts[2] not in ("0", "1"):
            continue
        name, pid, alive, code = parts
        result[name] = TaskStatus(
            name=name,
            pid=int(pid) if pid.isdigit() else None,
            alive=alive == "1",
            exit_code=int(code) if code.lstrip("-").isdigit() else None,
        )
    return result


def is_exit_marker(line: str) -> bool:
    """Whether a follow_log line is the closing exit-status line."""
    return line.startswith(EXIT_MARKER)


def parse_exit_marker(line: str) -> int | None:
    """The exit code on the exit-status line; None when the task left none
    (killed by a signal, or its node lost before it could write one)."""
    code = line[len(EXIT_MARKER) :].strip()
    return int(code) if code.lstrip("-").isdigit() else None


def parse_tail(stdout: str) -> Iterator[tuple[str, str]]:
    """``tail -v`` output -> (task, line) pairs; headers are ``==> x.log <==``."""
    current = ""
    for line in stdout.splitlines():
        header = re.fullmatch(r"==> (.+?)\.log <==", line)
        if header:
            current = header.group(1).rsplit("/", 1)[-1]
            continue
        if line or current:
            yield current, line


def tail_header(line: str) -> str | None:
    """The task name if ``line`` is a tail header, for streaming use."""
    header = re.fullmatch(r"==> (.+?)\.log <==", line)
    return header.group(1).rsplit("/", 1)[-1] if header else None
