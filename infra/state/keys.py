"""The per-cluster SSH key pair.

Each cluster gets its own ed25519 key, created on first use with mode 0600,
so that deleting a cluster's state revokes nothing else and no personal key
is ever copied into instance metadata.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from infra.errors import ConfigError


def ensure_key_pair(private_key: Path, comment: str) -> str:
    """Create ``private_key`` (and ``.pub``) if missing; return the public key line.

    Safe when several processes do it at once (two first ``up``s, or a
    ``status`` beside them): each writes a complete key to a temp file of
    its own and hard-links it into place, which fails if a key is already
    there; the losers then use the winner's key. So every caller ends with
    the same, complete key, and none sees a half-written one."""
    public_key = private_key.with_name(private_key.name + ".pub")
    if not private_key.exists():
        _create(private_key)
    mode = private_key.stat().st_mode & 0o777
    if mode & 0o077:
        # OpenSSH refuses keys others can read; so do we, with the fix.
        raise ConfigError(
            f"{private_key}: permissions {oct(mode)} are too open; run chmod 600 {private_key}"
        )
    line = _public_line(_load(private_key), comment)
    try:
        written = public_key.read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        written = ""
    if written.split()[:2] == line.split()[:2]:
        return written  # the same key (its comment may be the user's)
    # Missing, or left from a key deleted since: written from the private
    # key, atomically (racing writers write the same line).
    _write_atomic(public_key, (line + "\n").encode(), 0o644)
    return line


def _create(private_key: Path) -> None:
    """A new key at ``private_key``, unless another process put one there first."""
    private_key.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    tmp = _write_temp(private_key, pem, 0o600)
    try:
        os.link(tmp, private_key)  # never replaces: the first key stays
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)


def _write_temp(path: Path, data: bytes, mode: int) -> str:
    """``data`` in a new temp file beside ``path``, synced to disk, with
    ``mode`` from the start (mkstemp makes it 0600: never readable by
    others, not even briefly)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(tmp, mode)
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = _write_temp(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_private_file(path: Path, data: bytes) -> None:
    """``data`` at ``path``, readable by this user alone: 0600 from its first
    byte, in a folder made 0700 (one that exists is made so), renamed into
    place (a reader never sees half of it). The local nodes' environment
    files (infra/node/task_env.py) are written so."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path.parent, 0o700)
    _write_atomic(path, data, 0o600)


def read_public_key(private_key: Path) -> str:
    """The public key line of an existing private key (its .pub, else derived)."""
    public_key = private_key.with_name(private_key.name + ".pub")
    try:
        if public_key.exists():
            return public_key.read_text().strip()
        return _public_line(_load(private_key), "tfcluster")
    except OSError as exc:  # ssh.key_file a folder, or unreadable: the config's to fix
        raise ConfigError(f"{exc.filename}: cannot read the key: {exc.strerror}") from None


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
