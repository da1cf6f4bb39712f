"""Parsers for what the commands of ``infra/node/commands.py`` and
``infra/node/probes.py`` print.

Kept apart from the commands (as pyinfra's facts are) so each parser is
tested on recorded output, with no node needed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from infra.text import node_text

EXIT_MARKER = "@tfcluster-exit "


@dataclass(frozen=True)
class TaskStatus:
    name: str
    pid: int | None
    alive: bool
    exit_code: int | None  # None while running, or when it never wrote one


def parse_started(stdout: str) -> dict[str, int]:
    """``started worker-0 1234`` lines -> {task: pid}."""
    return {
        m.group(1): int(m.group(2))
        for m in re.finditer(r"^started (\S+) (\d+)$", stdout, re.MULTILINE)
    }


def parse_stopped(stdout: str) -> list[str]:
    """``stopped NAME`` lines -> the names."""
    return [m.group(1) for m in re.finditer(r"^stopped (\S+)$", stdout, re.MULTILINE)]


def parse_readiness(stdout: str) -> dict[str, str]:
    """``ready ps-0`` / ``dead worker-1`` / ``timeout chief-0`` lines: those
    before the tasks' own lines (``lines``, ``@log``), which are their
    output, and a line of output may hold a break of its own (a progress
    bar's carriage return) followed by any words."""
    result: dict[str, str] = {}
    for line in stdout.split("\n"):
        if line.startswith(("lines ", "@log ")):
            break
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("ready", "dead", "timeout"):
            result[parts[1]] = parts[0]
    return result


def parse_output(stdout: str) -> dict[str, tuple[int, list[str]]]:
    """``lines NAME N`` and ``@log NAME LINE`` lines of ``wait_ports`` ->
    {task: (its log's line count, its last lines)}; lines without
    terminal controls. A task whose count is missing or garbled is left
    out, as is a line of a task with no count."""
    counts: dict[str, int] = {}
    logged: dict[str, list[str]] = {}
    # At newlines only: the task's line is one line whatever it holds. Its
    # count comes before its lines: one a line of output makes comes later.
    for line in stdout.split("\n"):
        if line.startswith("@log "):
            _, name, text = [*line.split(" ", 2), ""][:3]
            logged.setdefault(name, []).append(node_text(text))
            continue
        parts = line.split()
        if len(parts) == 3 and parts[0] == "lines" and (n := int_of(parts[2])) is not None:
            counts.setdefault(parts[1], n)
    return {name: (n, logged.get(name, [])) for name, n in counts.items()}


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
            pid=int_of(pid),
            alive=alive == "1",
            exit_code=int_of(code, signed=True),
        )
    return result


def is_exit_marker(line: str) -> bool:
    """Whether a follow_log line is the closing exit-status line."""
    return line.startswith(EXIT_MARKER)


def parse_exit_marker(line: str) -> int | None:
    """The exit code on the exit-status line; None when the task left none
    (killed by a signal, or its node lost before it could write one)."""
    return int_of(line[len(EXIT_MARKER) :].strip(), signed=True)


def int_of(text: str, *, signed: bool = False) -> int | None:
    """A node's integer, or None. ASCII digits only, and not too many:
    str.isdigit() also takes "²", which int() refuses, and int()
    refuses more than 4300 digits; either would crash the caller."""
    return int(text) if re.fullmatch(r"-?[0-9]{1,18}" if signed else r"[0-9]{1,18}", text) else None


def parse_tail(stdout: str) -> Iterator[tuple[str, str]]:
    """``tail -v`` output -> (task, line) pairs; headers are ``==> x.log <==``.
    Lines come out without terminal controls (``infra/text.py``)."""
    current = ""
    for line in stdout.splitlines():
        header = re.fullmatch(r"==> (.+?)\.log <==", line)
        if header:
            current = node_text(header.group(1).rsplit("/", 1)[-1])
            continue
        if line or current:
            yield current, node_text(line)


def tail_header(line: str) -> str | None:
    """The task name if ``line`` is a tail header, for streaming use."""
    header = re.fullmatch(r"==> (.+?)\.log <==", line)
    return node_text(header.group(1).rsplit("/", 1)[-1]) if header else None


# TensorBoard's own start line: "TensorBoard 2.21.0 at http://127.0.0.1:40123/
# (Press CTRL+C to quit)" (its stderr, in the tensorboard task's log).
_TENSORBOARD_AT = re.compile(r"^TensorBoard \S+ at https?://[^\s/]+:(\d{1,5})/", re.MULTILINE)


def tensorboard_port(log: str) -> int | None:
    """The port TensorBoard says it serves on, from its log; None before it
    has said so."""
    match = _TENSORBOARD_AT.search(log)
    if match is None or not 0 < int(match.group(1)) < 65536:
        return None
    return int(match.group(1))

@dataclass(frozen=True)
class Gpu:
    name: str
    memory_mib: int | None
    utilization: int | None  # percent; None where nvidia-smi says [N/A] (MIG)


@dataclass(frozen=True)
class GpuReport:
    """What ``probes.gpu_query`` found: the GPUs, and why there are none
    when nvidia-smi is missing or failed (``problem``)."""

    gpus: tuple[Gpu, ...]
    problem: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "gpus": [
                {"name": g.name, "memory_mib": g.memory_mib, "utilization": g.utilization}
                for g in self.gpus
            ],
            "problem": self.problem,
        }


def _number(text: str) -> int | None:
    # ASCII digits only, and not too many: str.isdigit() takes "²" (which
    # int() refuses) and int() refuses more than 4300 digits.
    text = text.strip()
    return int(text) if re.fullmatch(r"[0-9]{1,12}", text) else None


def parse_gpus(stdout: str) -> GpuReport:
    """``probes.gpu_query`` output -> the GPUs. A name may hold commas
    (nvidia-smi does not quote them): the two numbers are the last fields."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    if lines == ["no nvidia-smi"]:
        return GpuReport((), "no nvidia-smi (no NVIDIA driver)")
    failed = next((line for line in lines if line.startswith("@nvidia-smi-exit ")), None)
    if failed is not None:
        said = next((node_text(line) for line in lines if not line.startswith("@")), "")
        code = failed.removeprefix("@nvidia-smi-exit ").strip()
        return GpuReport((), f"nvidia-smi failed (exit {node_text(code)}): {said}".rstrip(": "))
    gpus = []
    for line in lines:
        parts = line.rsplit(",", 2)
        if len(parts) != 3:
            continue
        name, memory, utilization = parts
        gpus.append(Gpu(node_text(name.strip()), _number(memory), _number(utilization)))
    return GpuReport(tuple(gpus))


def parse_cpu_count(stdout: str) -> int | None:
    """``cpus N`` (``commands.cpu_count``) -> N; None when the node could
    not say."""
    match = re.search(r"^cpus (\d{1,6})$", stdout, re.MULTILINE)
    return int(match.group(1)) if match and int(match.group(1)) > 0 else None


def parse_system_tensorflow(stdout: str) -> str | None:
    """``@tfcluster system-tensorflow 2.21.0`` -> "2.21.0"; None for ``none``."""
    match = re.search(r"^@tfcluster system-tensorflow (\S+)$", stdout, re.MULTILINE)
    if match is None or match.group(1) == "none":
        return None
    version = match.group(1)
    return version if re.fullmatch(r"[0-9][0-9A-Za-z.+!-]{0,40}", version) else None


@dataclass(frozen=True)
class GpuCheck:
    driver: bool  # nvidia-smi lists the GPUs
    tf_gpus: int | None  # GPUs TensorFlow sees; None when it could not say (import failed)


def parse_gpu_check(stdout: str) -> GpuCheck:
    """``@tfcluster driver yes|no`` and ``@tfcluster tf-gpus N|error`` lines;
    TensorFlow's own log lines around them are ignored."""
    driver = bool(re.search(r"^@tfcluster driver yes$", stdout, re.MULTILINE))
    count = re.search(r"^@tfcluster tf-gpus (\d+)$", stdout, re.MULTILINE)
    return GpuCheck(driver, int(count.group(1)) if count else None)


@dataclass(frozen=True)
class AutostopFacts:
    """One node's ``autostop AFTER IDLE BUSY WATCHING CONFIGURED`` line."""

    after_s: int | None  # None: off
    idle_s: int  # seconds since a task last ran here (0 while one runs)
    busy: bool
    watching: bool  # the watcher runs
    configured: bool  # autostop was ever set on this node


def parse_autostop(stdout: str) -> AutostopFacts | None:
    """The last ``autostop ...`` line; None when there is none (a node that
    printed something else: an old or broken layout)."""
    found = None
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 6 or parts[0] != "autostop":
            continue
        after, idle, busy, watching, configured = parts[1:]
        if not (idle.lstrip("-").isdigit() and busy.isdigit()):
            continue
        seconds = int(after) if after.isdigit() and int(after) > 0 else None
        found = AutostopFacts(
            after_s=seconds,
            idle_s=max(0, int(idle)),
            busy=int(busy) > 0,
            watching=watching == "1",
            configured=configured == "1",
        )
    return found
