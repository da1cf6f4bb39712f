"""`deploy.py tensorboard`: TensorBoard on a job's run folder, where it is written.

The run folder of a job lives on the chief's node while the job trains (it
comes home at the end), so TensorBoard runs there: a detached task named
``tensorboard`` started with the job's own commands (``commands.start_task``,
so ``stop_tasks`` finds and stops it), with its log and pid file in a folder
of its own (``<root>/tensorboard``): a job's start and ``deploy.py logs``
never see it. It listens on the node's 127.0.0.1 only, on a port it picks
(``--port 0``) and prints in its log (``facts.tensorboard_port``): nothing
on the node's network can reach it. Where the node is this machine (local
processes), it listens on the port wanted here instead. This machine reaches it through the
transport's ``forward`` (SSH: a local port tunnelled to the node; local
processes: the port itself). Closing stops the task.

Autostop counts a running TensorBoard as busy (its pid file). So that one
left behind (a dropped connection, a closed laptop) cannot keep a node up
for ever, it runs on a lease (infra/node/watchdog.py): each look of the
command's at it (``alive``, every 2 s while it serves) renews the lease,
and ``LEASE_S`` without one ends it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

from infra.errors import RemoteError
from infra.node import commands, facts
from infra.node.commands import board_layout
from infra.node.watchdog import Watch, renew_lease
from infra.transport.base import Transport

TASK = commands.TENSORBOARD_TASK
# TensorBoard imports TensorFlow when it is installed: tens of seconds on a
# small, busy machine before it listens.
START_TIMEOUT_S = 180.0
# TensorBoard ends this long after the command that serves it last looked.
LEASE_S = 90
_NOT_INSTALLED = "No module named tensorboard"


@dataclass
class Board:
    """A TensorBoard started on ``node`` for ``logdir`` (a layout path)."""

    node: str
    logdir: str
    remote_port: int
    url: str = ""


class TensorBoardTask:
    """Start, watch and stop the ``tensorboard`` task on one node."""

    def __init__(self, transport: Transport, node: str, logdir: str) -> None:
        self.transport = transport
        self.node = node
        self.logdir = logdir
        self.layout = board_layout(transport.layout(node))
        self.lease = f"{self.layout.logs}/{TASK}.lease"

    def start(self, timeout: float = START_TIMEOUT_S, port: int = 0) -> int:
        """Start TensorBoard on ``port`` (0: one it picks; one left from an
        earlier run is stopped first) and wait until it says its port;
        returns the port."""
        self.stop()
        argv = [
            "python", "-m", "tensorboard.main",
            "--logdir", self.logdir,
            "--host", "127.0.0.1",
            "--port", str(int(port)),
        ]  # fmt: skip
        watch = Watch.lease(self.lease, LEASE_S)
        result = self.transport.run(
            self.node, commands.start_task(self.layout, TASK, argv, env={}, watch=watch)
        )
        if not result.ok:
            raise RemoteError(f"{self.node}: could not start TensorBoard: {result.tail()}")
        deadline = time.monotonic() + timeout
        while True:
            log = self.log()
            said = facts.tensorboard_port(log)
            if said is not None:
                return said
            if not self.alive():
                last = " | ".join(log.strip().splitlines()[-3:]) or "no output"
                hint = None
                if _NOT_INSTALLED in log:
                    hint = (
                        "TensorBoard is not installed in the node's environment: "
                        "`deploy.py up` installs trainer/requirements.txt, which has it"
                    )
                raise RemoteError(f"{self.node}: TensorBoard ended at start: {last}", hint=hint)
            if time.monotonic() > deadline:
                raise RemoteError(
                    f"{self.node}: TensorBoard did not say its port within {timeout:.0f} s"
                )
            time.sleep(0.5)

    def log(self, lines: int = 200) -> str:
        return self.transport.run(
            self.node, commands.task_log_tail(self.layout, TASK, lines)
        ).stdout

    def alive(self) -> bool:
        """Whether TensorBoard runs; renews its lease."""
        renew = renew_lease(commands.path(self.lease))
        result = self.transport.run(
            self.node, commands.task_status(self.layout, [TASK]) + "\n" + renew
        )
        status = facts.parse_task_status(result.stdout).get(TASK)
        return status is not None and status.alive

    def stop(self) -> None:
        self.transport.run(self.node, commands.stop_tasks(self.layout, [TASK], grace=5.0))


@contextlib.contextmanager
def serve(transport: Transport, node: str, logdir: str, local_port: int) -> Iterator[Board]:
    """TensorBoard on ``node`` for ``logdir``, reachable from here while
    the ``with`` lasts (``Board.url``); stopped when it ends, Ctrl-C too."""
    task = TensorBoardTask(transport, node, logdir)
    try:
        # Where the node is this machine, TensorBoard itself listens on the
        # port wanted here: no tunnel would honour it otherwise.
        port = task.start(port=local_port if transport.ports_are_here else 0)
        with transport.forward(node, port, local_port) as here:
            yield Board(node, logdir, port, url=f"http://127.0.0.1:{here}/")
    finally:
        with contextlib.suppress(RemoteError):
            task.stop()


def watch(transport: Transport, board: Board, every: float = 2.0) -> None:
    """Return when the TensorBoard of ``board`` has ended (RemoteError with
    its last lines); Ctrl-C (KeyboardInterrupt) is the ordinary way out."""
    task = TensorBoardTask(transport, board.node, board.logdir)
    while task.alive():
        time.sleep(every)
    last = " | ".join(task.log(3).strip().splitlines()) or "no output"
    raise RemoteError(f"{board.node}: TensorBoard ended: {last}")
