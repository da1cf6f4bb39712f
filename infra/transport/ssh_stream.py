"""Following a command's output over SSH as it comes (``SshTransport.stream``):
a raw paramiko channel, each stdout line handed on as it arrives, stderr
drained beside it, and a node that stops answering told from one that is
only quiet."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import paramiko
from paramiko.ssh_exception import SSHException

from infra.errors import RemoteError


def follow(
    node: str,
    transport: paramiko.Transport,
    command: str,
    on_line: Callable[[str], None],
    *,
    timeout: float | None,
    drop: Callable[[], None],
) -> int:
    """Run ``command`` (already the line sshd runs) on ``transport``, with
    ``on_line`` for each stdout line; its exit code. ``drop``: forget the
    node's connection, called before the errors that mean it is gone."""
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        chan = transport.open_session()
    except (SSHException, OSError, EOFError) as exc:
        drop()
        raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None
    stderr: list[bytes] = []

    def drain_stderr() -> None:
        # stdout and stderr share one flow-control window: an unread
        # stderr would stall stdout. Keep only its tail, for errors.
        while True:
            data = chan.recv_stderr(32768)
            if not data:
                return
            stderr.append(data)
            del stderr[:-16]

    try:
        chan.exec_command(command)
        chan.shutdown_write()
        reader = threading.Thread(target=drain_stderr, daemon=True)
        reader.start()
        _read_lines(node, chan, transport, on_line, deadline, timeout, drop)
        if not chan.exit_status_ready() and not transport.is_active():
            raise RemoteError(f"{node}: lost the SSH connection while following the output")
        chan.settimeout(None)
        code = chan.recv_exit_status()
        reader.join(1.0)
        if code == -1 and not transport.is_active():
            raise RemoteError(f"{node}: lost the SSH connection while following the output")
        return code
    except (SSHException, OSError, EOFError) as exc:
        drop()
        raise RemoteError(f"{node}: lost the SSH connection: {exc}") from None
    finally:
        chan.close()


def _read_lines(
    node: str,
    chan: paramiko.Channel,
    transport: paramiko.Transport,
    on_line: Callable[[str], None],
    deadline: float | None,
    timeout: float | None,
    drop: Callable[[], None],
) -> None:
    """``on_line`` with each stdout line of ``chan`` until it ends (or
    the connection does); a node that stops answering is an error."""
    buffer = b""
    chan.settimeout(0.5)
    liveness = Liveness(transport)
    while True:
        if deadline is not None and time.monotonic() > deadline:
            raise RemoteError(f"{node}: command timed out after {timeout:g} s")
        try:
            data = chan.recv(65536)
        except TimeoutError:
            if not transport.is_active():
                break
            if not liveness.check():
                drop()
                raise RemoteError(
                    f"{node}: no answer for {liveness.silent_s():.0f} s: the node "
                    "stopped or the network to it is down"
                ) from None
            continue
        if not data:
            break
        liveness.heard()
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            on_line(line.decode("utf-8", "replace").rstrip("\r"))
    if buffer:
        on_line(buffer.decode("utf-8", "replace").rstrip("\r"))


class Liveness:
    """Tells a quiet connection from a dead one while a stream waits.

    A node that stops (or loses its network) without closing the TCP
    connection leaves nothing to read and nothing to fail: keepalives sit
    in the send buffer for the kernel's retransmission timeout (many
    minutes). After ``QUIET_S`` without output, a keepalive that asks for a
    reply goes out on a thread; no reply within ``REPLY_S`` means the node
    is gone.
    """

    QUIET_S = 15.0
    REPLY_S = 15.0

    def __init__(self, transport: paramiko.Transport) -> None:
        self.transport = transport
        self.last = time.monotonic()
        self.probe: threading.Thread | None = None
        self.probe_sent = 0.0

    def heard(self) -> None:
        self.last = time.monotonic()

    def silent_s(self) -> float:
        return time.monotonic() - self.last

    def check(self) -> bool:
        """False once the node has not answered a probe in time."""
        now = time.monotonic()
        if self.probe is not None:
            if not self.probe.is_alive():
                self.probe = None
                self.last = now  # it answered
            elif now - self.probe_sent > self.REPLY_S:
                return False
            return True
        if now - self.last > self.QUIET_S:
            self.probe_sent = now
            self.probe = threading.Thread(
                target=self.transport.global_request,
                args=("keepalive@openssh.com",),
                kwargs={"wait": True},
                daemon=True,
            )
            self.probe.start()
        return True
