"""The per-cluster SSH key pair.

Each cluster gets its own ed25519 key, created on first use with mode 0600,
so that deleting a cluster's state revokes nothing else and no personal key
is ever copied into instance metadata.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from infra.errors import ConfigError


def ensure_key_pair(private_key: Path, comment: str) -> str:
    """Create ``private_key`` (and ``.pub``) if missing; return the public key line."""
    public_key = private_key.with_name(private_key.name + ".pub")
    if private_key.exists():
        mode = private_key.stat().st_mode & 0o777
        if mode & 0o077:
            # OpenSSH refuses keys others can read; so do we, with the fix.
            raise ConfigError(
                f"{private_key}: permissions {oct(mode)} are too open; run chmod 600 {private_key}"
            )
        if not public_key.exists():
            public_key.write_text(_public_line(_load(private_key), comment) + "\n")
        return public_key.read_text().strip()
    private_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    # Created 0600 from the start: never world-readable, not even briefly.
    fd = os.open(private_key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)
    line = _public_line(key, comment)
    public_key.write_text(line + "\n")
    return line


def read_public_key(private_key: Path) -> str:
    """The public key line of an existing private key (its .pub, else derived)."""
    public_key = private_key.with_name(private_key.name + ".pub")
    if public_key.exists():
        return public_key.read_text().strip()
    return _public_line(_load(private_key), "tfcluster")


def _load(private_key: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_ssh_private_key(private_key.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"{private_key}: not a readable unencrypted OpenSSH key ({exc})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ConfigError(
            f"{private_key}: expected an ed25519 key; create one with ssh-keygen -t ed25519"
        )
    return key


def _public_line(key: Ed25519PrivateKey, comment: str) -> str:
    raw = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    )
    return f"{raw.decode()} {comment}"


def cluster_key(key_file: str | None, state_key: Path, comment: str) -> tuple[Path, str]:
    """The private key a cluster logs in with, and its public line.

    ``ssh.key_file`` when set (the user's own key, never created by us);
    otherwise the per-cluster key in the state folder, created on first use.
    """
    if key_file:
        path = Path(os.path.expanduser(key_file))
        if not path.exists():
            raise ConfigError(
                f"ssh.key_file: {path} does not exist; create it with "
                f"ssh-keygen -t ed25519 -f {path}, or remove the key to use a per-cluster key"
            )
        return path, read_public_key(path)
    return state_key, ensure_key_pair(state_key, comment)
