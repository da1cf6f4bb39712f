"""What a failed task's log says, in a few lines.

A failed task's log ends with what matters (a Python traceback, most often)
and may hold values printed whole: Keras 3's ``Attempt to convert a value
(PerReplica:{...})`` prints every tensor of a batch, sixty lines and more,
and a tail of fifteen lines then showed only rows of numbers. ``condense``
keeps the last traceback's innermost frame and its exception, the exception
cut to a few lines (its first and its last, which names the type), and
otherwise the log's last lines; each line cut to a screen's width or so,
TensorFlow's load-time log (infra/jobs/tf_noise.py) left out.
``deploy.py logs`` has every line. ``failure_details`` reads those lines
from the failed tasks' nodes.
"""

from __future__ import annotations

from collections.abc import Sequence

from infra.errors import HostKeyChanged, RemoteError
from infra.jobs.tf_noise import is_tf_noise
from infra.node import commands
from infra.spec.tfconfig import TaskSpec
from infra.text import node_text
from infra.transport.base import Transport

TRACEBACK = "Traceback (most recent call last):"
# Lines of a log read to find the failure, and lines shown without a traceback.
READ_LINES = 400
TAIL_LINES = 15
# An exception's lines kept: the first ones and the last one.
HEAD_LINES = 3
LINE_CHARS = 300


def condense(lines: Sequence[str]) -> list[str]:
    """The lines of a failed task's log worth showing (see the module)."""
    lines = [line.rstrip() for line in lines if not is_tf_noise(line)]
    while lines and not lines[-1]:
        lines.pop()
    start = max((i for i, line in enumerate(lines) if line.strip() == TRACEBACK), default=None)
    if start is None:
        return [_cut(line) for line in lines[-TAIL_LINES:]]
    body = lines[start + 1 :]
    frames = [i for i, line in enumerate(body) if line.startswith("  File ")]
    # The exception: the first line after the last frame that is not the
    # frame's own (indented) source and markers.
    after = frames[-1] + 1 if frames else 0
    while after < len(body) and body[after].startswith(" "):
        after += 1
    frame = body[frames[-1] : frames[-1] + 2] if frames else []
    return [TRACEBACK, *(_cut(x) for x in frame), *_exception(body[after:])]


def _exception(lines: list[str]) -> list[str]:
    """An exception's text, at most HEAD_LINES + 2 lines."""
    if len(lines) <= HEAD_LINES + 2:
        return [_cut(x) for x in lines]
    cut = len(lines) - HEAD_LINES - 1
    return [
        *(_cut(x) for x in lines[:HEAD_LINES]),
        f"  ... ({cut} more lines: `deploy.py logs` has them all)",
        _cut(lines[-1]),
    ]


def _cut(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 3] + "..."


# What TensorFlow says when a program's strategy and the job's task types
# do not fit, and what to do about it.
_MISMATCH = (
    (
        "There is no id for task_type 'ps'",
        "a collective program (MultiWorkerMirroredStrategy) takes no ps task: "
        "`deploy.py run --no-ps -- ...`, or leave ps out of cluster.yaml's roles",
    ),
    (
        "There must be at least one ps.",
        "ParameterServerStrategy needs a ps task: add a ps to cluster.yaml's roles "
        "(roles.ps) and run without --no-ps",
    ),
    (
        "There must be at least one worker.",
        "ParameterServerStrategy needs worker tasks: add roles.worker to cluster.yaml",
    ),
)


def strategy_hint(lines: Sequence[str]) -> str | None:
    """What to do when a failed task's lines say that its strategy does
    not fit the job's tasks (a collective program given a ps, say)."""
    for needle, hint in _MISMATCH:
        if any(needle in line for line in lines):
            return hint
    return None


def failure_details(transport: Transport, tasks: Sequence[TaskSpec]) -> list[str]:
    """What these tasks' logs end with, ``node/task | line``: the last
    traceback's exception, long values cut (``condense``). A node that does
    not answer has no details; one whose host key changed is raised once
    the others were read."""
    lines: list[str] = []
    changed: HostKeyChanged | None = None
    for task in tasks:
        try:
            result = transport.run(
                task.node,
                commands.task_log_tail(transport.layout(task.node), task.name, READ_LINES),
                timeout=30,
            )
        except HostKeyChanged as exc:
            changed = changed or exc
            continue
        except RemoteError:
            continue
        lines += [
            f"{task.node}/{task.name} | {node_text(line)}"
            for line in condense(result.stdout.split("\n"))
        ]
    if changed is not None:
        raise changed
    return lines
