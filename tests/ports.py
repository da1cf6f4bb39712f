"""Free TCP ports on loopback for the servers a test starts.

A port found free is released before its server binds it, and the kernel
hands a just-released port out again readily (about 3 draws in 100 here):
the ports one test needs together are drawn together, each held until the
last is known, so they differ (two drawn one by one once gave two of a
job's tasks one port)."""

from __future__ import annotations

import contextlib
import socket


def free_ports(count: int) -> list[int]:
    """``count`` different ports, free now."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def free_port() -> int:
    """One port, free now."""
    return free_ports(1)[0]
