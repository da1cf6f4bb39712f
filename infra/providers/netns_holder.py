"""The holder of a local cluster's network namespace (infra/providers/local_network.py).

Run as a script, ``python -I -S netns_holder.py``, never imported: it
imports nothing of tfcluster's and nothing outside the standard library,
so it starts in a fraction of a second from any interpreter.

It makes a user namespace and a network namespace (what Linux lets a user
without root do, where unprivileged user namespaces are on), maps the
user's own uid and gid to themselves in it (the tasks keep their uid, not
root's), brings the namespace's loopback up, and prints one line:
``ready PID NETNS`` (its pid and ``net:[inode]``), or ``error WHY``. Then
it becomes ``sleep infinity`` (the namespaces stay with the process across
exec, and a sleep costs almost nothing), reparented to init: the one who
started it may exit, and Ctrl-C in its terminal does not reach it. A
namespace lives as long as a process is in it; this one keeps it between
jobs, until `down` ends it.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import signal
import socket
import struct
import sys

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1
# struct ifreq: a 16-byte name, then a 24-byte union whose first field is
# the flags (short); the kernel copies all 40 bytes.
IFREQ = "16sH22x"


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        got = fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack(IFREQ, b"lo", 0))
        flags = struct.unpack(IFREQ, got)[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack(IFREQ, b"lo", flags | IFF_UP))


def make_namespace() -> None:
    """Enter a new user and network namespace, the user mapped to itself,
    its loopback up (the capabilities the new user namespace gives this
    process are still held: no exec since)."""
    uid, gid = os.getuid(), os.getgid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), "unshare")
    # A process may map only its own ids without privilege, and only once
    # setgroups is denied (so that dropping groups cannot grant access).
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{gid} {gid} 1\n")
    _loopback_up()


def main() -> int:
    try:
        make_namespace()
    except OSError as exc:
        print(f"error {exc.filename or 'namespace'}: {exc.strerror or exc}", flush=True)
        return 1
    if os.fork():
        os._exit(0)  # the starter reaps this one; the holder goes on, reparented
    os.setsid()
    os.chdir("/")  # holds no folder of the user's
    print(f"ready {os.getpid()} {os.readlink('/proc/self/ns/net')}", flush=True)
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, 256)
    try:
        # Nothing of the starter's environment (a token in it) is kept.
        os.execvpe("sleep", ["sleep", "infinity"], {"PATH": os.environ.get("PATH", "/bin")})
    except OSError:
        while True:  # no sleep(1) that knows infinity: wait here
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
