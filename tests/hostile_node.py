"""A node that lies: a real SSH server (paramiko) on 127.0.0.1 whose SFTP
listings are whatever a test says, for attacking ``SshTransport`` through
its own connection code (key login, host key pinning, Fabric, SFTP).

``FakeNode(listing=...)``: SFTP answers from ``listing(path)`` (a folder's
entries, or None where ``path`` is a file whose content is ``CONTENT``);
every command fails (exit 1: no rsync, so a fetch takes the SFTP path).
``streaming=True``: a file declared ``len(CONTENT)`` bytes long answers a
read at any offset, for ever (``reads`` records the offsets asked);
``silent_listing=True``: a folder's listing is never answered (until the
node is closed).
``FakeNode(home=...)``: commands run with ``sh -c`` in ``home`` (so the
system ssh and rsync work against it) and SFTP is paramiko's own, served
from ``home`` (read-only, unless ``writable``); ``bin``: a folder first on those
commands' PATH (a node's own rsync, say).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
from paramiko.common import (
    AUTH_FAILED,
    AUTH_SUCCESSFUL,
    OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED,
    OPEN_SUCCEEDED,
)
from paramiko.sftp import SFTP_NO_SUCH_FILE, SFTP_PERMISSION_DENIED

CONTENT = b"written by the node\n"
MTIME = 1_700_000_000

Entry = tuple[str | bytes, int | None]  # name as the node sends it, st_mode (None: none sent)
Listing = Callable[[str], list[Entry] | None]

DIR = stat.S_IFDIR | 0o755
FILE = stat.S_IFREG | 0o644
LINK = stat.S_IFLNK | 0o777
FIFO = stat.S_IFIFO | 0o644
CHAR = stat.S_IFCHR | 0o644


def _attrs(name: str | bytes, mode: int | None, size: int) -> paramiko.SFTPAttributes:
    attr = paramiko.SFTPAttributes()
    attr.filename = name  # type: ignore[assignment]  # bytes: a name that is not UTF-8
    attr.st_mode = mode
    attr.st_size = size
    attr.st_atime = attr.st_mtime = MTIME
    return attr


class _Handle(paramiko.SFTPHandle):
    def __init__(self) -> None:
        super().__init__()
        self.readfile = io.BytesIO(CONTENT)

    def stat(self) -> paramiko.SFTPAttributes:
        return _attrs("", FILE, len(CONTENT))


class _Endless(_Handle):
    """A file that goes on past the size it declared."""

    def __init__(self, node: FakeNode) -> None:
        super().__init__()
        self.node = node

    def read(self, offset: int, length: int) -> bytes:
        self.node.reads.append(offset)
        return b"x" * length


class _LyingSFTP(paramiko.SFTPServerInterface):
    def __init__(self, server: paramiko.ServerInterface, node: FakeNode) -> None:
        super().__init__(server)
        self.node = node

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes] | int:
        assert self.node.listing is not None
        self.node.requests.append(("list", path))
        if self.node.silent_listing:
            self.node._stop.wait()
        entries = self.node.listing(path)
        if entries is None:
            return SFTP_NO_SUCH_FILE
        return [_attrs(name, mode, len(CONTENT)) for name, mode in entries]

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        assert self.node.listing is not None
        if self.node.listing(path) is not None:
            return _attrs(path, DIR, 4096)
        return _attrs(path, FILE, len(CONTENT))

    lstat = stat

    def open(self, path: str, flags: int, attr: paramiko.SFTPAttributes) -> _Handle | int:
        self.node.requests.append(("open", path))
        if flags & (os.O_WRONLY | os.O_RDWR):
            return SFTP_PERMISSION_DENIED
        return _Endless(self.node) if self.node.streaming else _Handle()


class _HomeSFTP(paramiko.SFTPServerInterface):
    """Plain SFTP on the files under ``home`` (paths relative to it)."""

    def __init__(self, server: paramiko.ServerInterface, node: FakeNode) -> None:
        super().__init__(server)
        assert node.home is not None
        self.home = node.home
        self.writable = node.writable

    def _real(self, path: str) -> str:
        return str(self.home / path.lstrip("/"))

    def list_folder(self, path: str) -> list[paramiko.SFTPAttributes] | int:
        real = self._real(path)
        try:
            names = os.listdir(real)
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno or 0)
        return [
            paramiko.SFTPAttributes.from_stat(os.lstat(os.path.join(real, n)), n) for n in names
        ]

    def stat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.stat(self._real(path)))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno or 0)

    def lstat(self, path: str) -> paramiko.SFTPAttributes | int:
        try:
            return paramiko.SFTPAttributes.from_stat(os.lstat(self._real(path)))
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno or 0)

    def open(
        self, path: str, flags: int, attr: paramiko.SFTPAttributes
    ) -> paramiko.SFTPHandle | int:
        writing = bool(flags & (os.O_WRONLY | os.O_RDWR))
        if writing and not self.writable:
            return SFTP_PERMISSION_DENIED
        handle = paramiko.SFTPHandle(flags)
        try:
            if writing:  # paramiko hands over the os.open flags
                fd = os.open(self._real(path), flags | os.O_CLOEXEC, 0o600)
                handle.writefile = os.fdopen(fd, "wb")  # type: ignore[attr-defined]
            else:
                handle.readfile = open(self._real(path), "rb")  # type: ignore[attr-defined]  # noqa: SIM115
        except OSError as exc:
            return paramiko.SFTPServer.convert_errno(exc.errno or 0)
        return handle


class _Server(paramiko.ServerInterface):
    def __init__(self, node: FakeNode) -> None:
        self.node = node

    def get_allowed_auths(self, username: str) -> str:
        return "publickey"

    def check_auth_publickey(self, username: str, key: paramiko.PKey) -> int:
        if key.get_base64() == self.node.authorized.get_base64():
            return AUTH_SUCCESSFUL
        return AUTH_FAILED

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return OPEN_SUCCEEDED
        return OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        self.node.commands.append(command.decode("utf-8", "replace"))
        threading.Thread(
            target=self.node.execute, args=(channel, command.decode()), daemon=True
        ).start()
        return True


class FakeNode:
    """An sshd on 127.0.0.1:``port``; ``rekey()`` makes it present another host key."""

    def __init__(
        self,
        authorized: paramiko.PKey,
        *,
        listing: Listing | None = None,
        home: Path | None = None,
        follow_output: str | None = None,
        streaming: bool = False,
        silent_listing: bool = False,
        bin: Path | None = None,
        writable: bool = False,
    ) -> None:
        self.authorized = authorized
        self.listing = listing
        self.home = home
        self.writable = writable
        self.follow_output = follow_output
        self.streaming = streaming
        self.silent_listing = silent_listing
        self.bin = bin
        self.reads: list[int] = []
        # paramiko generates no ed25519 keys; ECDSA is what OpenSSH accepts too.
        self.host_key: paramiko.PKey = paramiko.ECDSAKey.generate()
        self.requests: list[tuple[str, str]] = []
        self.commands: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(8)
        self._sock.settimeout(0.2)
        self.port = int(self._sock.getsockname()[1])
        self._transports: list[paramiko.Transport] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def rekey(self) -> None:
        self.host_key = paramiko.ECDSAKey.generate()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except (TimeoutError, OSError):
                continue
            transport = paramiko.Transport(client)
            transport.add_server_key(self.host_key)
            sftp = _HomeSFTP if self.home is not None else _LyingSFTP
            transport.set_subsystem_handler("sftp", paramiko.SFTPServer, sftp, self)
            self._transports.append(transport)
            with contextlib.suppress(Exception):
                transport.start_server(server=_Server(self))

    def execute(self, channel: paramiko.Channel, command: str) -> None:
        # paramiko sends the exec reply after check_channel_exec_request
        # returns: let it go first.
        time.sleep(0.05)
        try:
            if self.home is not None:
                self._shell(channel, command)
            elif self.follow_output is not None and "@tfcluster-exit" in command:
                channel.sendall(self.follow_output.encode())
                channel.send_exit_status(0)
            else:
                channel.send_exit_status(1)
        finally:
            channel.shutdown_write()
            channel.close()

    def _shell(self, channel: paramiko.Channel, command: str) -> None:
        env = dict(os.environ)
        if self.bin is not None:
            env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        proc = subprocess.Popen(
            command,
            shell=True,
            cwd=self.home,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdin and proc.stdout and proc.stderr
        stdin, stdout, stderr = proc.stdin, proc.stdout, proc.stderr

        def feed() -> None:
            # ValueError: the pipe was closed when the command ended.
            with contextlib.suppress(OSError, ValueError):
                while data := channel.recv(65536):
                    stdin.write(data)
                    stdin.flush()
                stdin.close()

        def errors() -> None:
            # OSError: the client closed the channel (a fetch past its
            # limit hangs up) while the command still wrote: nobody to tell.
            with contextlib.suppress(OSError):
                while data := os.read(stderr.fileno(), 65536):
                    channel.sendall_stderr(data)

        with proc:  # closes the pipes, waits
            pumps = [threading.Thread(target=f, daemon=True) for f in (feed, errors)]
            for pump in pumps:
                pump.start()
            while data := os.read(stdout.fileno(), 65536):
                channel.sendall(data)
            pumps[1].join(10)
            code = proc.wait()
        channel.send_exit_status(code)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        for transport in self._transports:
            transport.close()


@contextlib.contextmanager
def fake_node(authorized: paramiko.PKey, **kwargs: object) -> Iterator[FakeNode]:
    node = FakeNode(authorized, **kwargs)  # type: ignore[arg-type]
    try:
        yield node
    finally:
        node.close()
