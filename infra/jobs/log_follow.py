"""Every node's task logs followed at once (`deploy.py logs --follow`),
each line to the caller with its node and task, until the tasks named end
(or Ctrl-C); a node lost meanwhile is warned about while the others go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from infra.errors import HostKeyChanged, RemoteError, combine_errors
from infra.node import commands, facts
from infra.text import node_text
from infra.transport.base import Transport
from infra.transport.fanout import in_threads

log = logging.getLogger("tfcluster")


def follow_all(
    transport: Transport,
    nodes: Sequence[str],
    lines: int,
    on_line: Callable[[str, str, str], None],
    until: Mapping[str, Sequence[str]] | None,
) -> None:
    """Follow every node's logs at once while the ``until`` tasks of each
    node run (None: until Ctrl-C). What a thread raises
    is raised here: a changed host key (or a bug) at once; a node lost
    otherwise is warned about while the others go on, and raised once
    none is left."""
    errors: dict[str, BaseException] = {}

    def follow(node: str) -> None:
        task = ""

        def handle(line: str) -> None:
            nonlocal task
            header = facts.tail_header(line)
            if header is not None:
                task = header
            elif line:
                on_line(node, task, node_text(line))

        try:
            command = commands.tail_logs(
                transport.layout(node), lines, True, until[node] if until is not None else None
            )
            transport.stream(node, command, handle)
        except BaseException as exc:  # raised in the caller's thread, below
            errors[node] = exc
            if isinstance(exc, RemoteError) and len(nodes) > 1:
                log.warning("%s; following the other nodes", exc)

    def fatal() -> BaseException | None:
        # list(): a copy made at once, while other threads may still add.
        for exc in list(errors.values()):
            if isinstance(exc, HostKeyChanged) or not isinstance(exc, RemoteError):
                return exc
        return None

    in_threads(follow, nodes, fatal)
    if (exc := fatal()) is not None:
        raise exc
    if errors:
        raise combine_errors({n: e for n in nodes if isinstance(e := errors.get(n), RemoteError)})
