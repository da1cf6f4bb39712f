"""The system OpenSSH client's command line for a node, with the
cluster's own key and pinned host keys and nothing of the user's
(``~/.ssh/config``, agent, ``known_hosts``): rsync's ``-e`` and
``deploy.py ssh`` run it, where every other command goes through paramiko
(ssh_connections.py) with the same key and pins.
"""

from __future__ import annotations

from pathlib import Path


def system_ssh_argv(
    *,
    key_file: Path,
    known_hosts: Path,
    user: str,
    port: int,
    alias: str | None,
    connect_timeout: float,
    batch: bool,
) -> list[str]:
    """``ssh`` and its options up to the host (no host, no command).
    ``alias``: the name the node's host key is pinned under, when not its
    address; ``batch``: no prompt (rsync), else a user's shell."""
    argv = [
        "ssh",
        # -o, not -i: ssh checks an -i file before expanding its %-tokens.
        "-o", f"IdentityFile={_option_path(key_file)}",
        "-p", str(port),
        "-l", user,
        "-o", "IdentitiesOnly=yes",
        "-o", "IdentityAgent=none",
        "-o", f"UserKnownHostsFile={_option_path(known_hosts)}",
        "-o", "GlobalKnownHostsFile=/dev/null",
        "-o", "StrictHostKeyChecking=yes",
        "-o", "HashKnownHosts=no",
        *(["-o", f"HostKeyAlias={alias}"] if alias else []),
        "-o", f"ConnectTimeout={max(1, round(connect_timeout))}",
        "-o", "ServerAliveInterval=15",
        "-F", "/dev/null",
    ]  # fmt: skip
    if batch:
        argv += ["-o", "BatchMode=yes", "-o", "LogLevel=ERROR"]
        # rsync opens a connection per call: OpenSSH's default hybrid
        # post-quantum key exchange adds ~0.1 s of CPU to each, which on
        # small nodes is most of a no-op sync. X25519 is what the
        # paramiko connections (every command) use anyway.
        argv += ["-o", "KexAlgorithms=curve25519-sha256,curve25519-sha256@libssh.org"]
    return argv


def _option_path(path: Path) -> str:
    """A file as an ``-o Key=value`` value: OpenSSH expands %-tokens in file
    options and splits the value at spaces unless double-quoted (with \\
    and \" escaped)."""
    text = str(path).replace("%", "%%")
    if all(c.isalnum() or c in "_./+,:@-" for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
