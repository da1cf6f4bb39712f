"""Bringing a node's folder here, without trusting the node.

``SshTransport.fetch`` (``infra/remote.py``) copies a run folder home with
rsync (``rsync_fetch_args``, then ``_merge_staged``) or SFTP
(``sftp_get_tree``). Either way the node names the entries, so only plain
files and folders whose names are one plain path component arrive, each
inside the destination: a name with ``/`` or ``..``, a symlink or a special
file fails the fetch (``UnsafeRemoteEntry`` naming the node and the entry)
before anything is written for it, and nothing is ever written through a
symlink here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath

import paramiko

from infra.errors import RemoteError, UnsafeRemoteEntry

# A fetched tree deeper than this is a node answering every listing with
# another folder (it would end in a RecursionError, a traceback).
MAX_FETCH_DEPTH = 64
# The fresh folder an rsync fetch lands in, inside the destination.
STAGING_PREFIX = ".tfcluster-fetch-"


def rsync_fetch_args(source: str, staging: Path, previous: Path) -> list[str]:
    """rsync flags to pull the node folder ``source`` (``user@host:dir/``)
    into the fresh folder ``staging``.

    Recursive with times only: without ``-l``/``-D`` (what ``-a`` implies)
    rsync skips the node's symlinks, devices and fifos instead of making
    them here, and without ``-p``/``-o``/``-g`` the node picks no modes or
    owners (no setuid file from it). ``--link-dest`` makes every file that
    is unchanged from ``previous`` (the destination: the last fetch) a
    hard link of it, so only changes cross the network. ``-s`` sends the
    remote path through rsync's protocol, not the node's shell; ``--``
    ends the options, so no path is ever read as one."""
    return [
        "--recursive",
        "--times",
        "--safe-links",  # no-op without -l; stays right if -l is ever added
        "-s",
        f"--link-dest={previous.resolve()}",
        "--",
        source,
        f"{staging}/",
    ]


def _refuse(node: str, path: str, why: str, hint: str | None = None) -> UnsafeRemoteEntry:
    # The end of a long path: the entry's own name is what matters.
    shown = path if len(path) <= 120 else "..." + path[-117:]
    return UnsafeRemoteEntry(
        f"{node}: refused to fetch {shown!r}: {why}",
        hint=hint
        or (
            "a fetch brings only plain files and folders into the run folder; if no "
            f"program of yours made that entry, treat {node} as compromised"
        ),
    )


def _not_a_folder(node: str, entry: str, path: Path) -> UnsafeRemoteEntry:
    return _refuse(
        node,
        entry,
        f"it is a folder, and {path} here is not a real folder",
        hint=f"move {path} out of the way (a fetch never writes through a symlink) and fetch again",
    )


def _plain_name(node: str, folder: str, name: str) -> str:
    """``name`` if it is one plain path component, else a refusal: a node
    names entries, and ``/``, ``..`` or an absolute name would climb out."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise _refuse(node, f"{folder}/{name}", "its name leaves the folder it is in")
    return name


def _local_folder(node: str, entry: str, path: Path) -> None:
    """``path`` is (made) a real folder: a symlink or a file there is not
    followed (the old run folder is this machine's, but an earlier copy
    could hold anything)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        path.mkdir()
        return
    if not stat.S_ISDIR(mode):
        raise _not_a_folder(node, entry, path)


def sftp_get_tree(
    node: str, sftp: paramiko.SFTPClient, remote: str, local: Path, *, depth: int
) -> None:
    if depth > MAX_FETCH_DEPTH:
        raise _refuse(node, remote, f"folders nest more than {MAX_FETCH_DEPTH} deep")
    # Every name of the folder is checked before any of them is written.
    entries = [
        (_plain_name(node, remote, entry.filename), entry) for entry in sftp.listdir_attr(remote)
    ]
    for name, entry in entries:
        source = str(PurePosixPath(remote) / name)
        dest = local / name
        mode = entry.st_mode or 0
        if stat.S_ISDIR(mode):
            _local_folder(node, source, dest)
            sftp_get_tree(node, sftp, source, dest, depth=depth + 1)
        elif stat.S_ISREG(mode):
            _sftp_get_file(sftp, source, dest, entry)
        else:
            raise _refuse(node, source, f"it is {_kind(mode)}, not a plain file or folder")


def _sftp_get_file(
    sftp: paramiko.SFTPClient, source: str, dest: Path, entry: paramiko.SFTPAttributes
) -> None:
    """One file, unless the same size and time are here already; written
    to a new temporary file and renamed over ``dest`` (which replaces a
    symlink there instead of writing through it)."""
    try:
        have = dest.lstat()
        if (
            stat.S_ISREG(have.st_mode)
            and have.st_size == entry.st_size
            and int(have.st_mtime) == entry.st_mtime
        ):
            return
    except FileNotFoundError:
        pass
    # A new name (O_EXCL: nothing there to follow), modes as umask says.
    part = dest.parent / f"{STAGING_PREFIX}{secrets.token_hex(8)}"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as out:
            sftp.getfo(source, out)
        if entry.st_mtime is not None:
            os.utime(part, (entry.st_atime or entry.st_mtime, entry.st_mtime))
        os.replace(part, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(part)
        raise


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISFIFO(mode):
        return "a fifo"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return f"of unknown type (mode {mode:#o})"


def _merge_staged(node: str, staging: Path, dest: Path, remote: str) -> None:
    """Move what rsync put in ``staging`` into ``dest``: after checking the
    whole tree (plain files and folders only: rsync was asked for nothing
    else), so a refusal leaves ``dest`` as it was."""
    moves: list[tuple[Path, Path]] = []

    def walk(folder: Path, target: Path, where: str, depth: int) -> None:
        if depth > MAX_FETCH_DEPTH:
            raise _refuse(node, where, f"folders nest more than {MAX_FETCH_DEPTH} deep")
        with os.scandir(folder) as listing:
            for item in sorted(listing, key=lambda e: e.name):
                entry = f"{where}/{item.name}"
                mode = item.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    here = target / item.name
                    with contextlib.suppress(FileNotFoundError):
                        if not stat.S_ISDIR(here.lstat().st_mode):
                            raise _not_a_folder(node, entry, here)
                    moves.append((Path(item.path), here))
                    walk(Path(item.path), here, entry, depth + 1)
                elif stat.S_ISREG(mode):
                    moves.append((Path(item.path), target / item.name))
                else:
                    raise _refuse(node, entry, f"it is {_kind(mode)}, not a plain file or folder")

    walk(staging, dest, remote, 0)
    for source, target in moves:
        if stat.S_ISDIR(source.lstat().st_mode):
            _local_folder(node, str(target), target)
        else:
            os.replace(source, target)


def fetch_staged(node: str, remote: str, local_dir: Path, pull: Callable[[Path], object]) -> None:
    """``pull`` (an rsync) into a fresh folder inside ``local_dir`` (nothing
    there for the node's names to meet: no old symlink to write through),
    check what arrived, then move it into place."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=local_dir))
    try:
        pull(staging)
        try:
            _merge_staged(node, staging, local_dir, remote)
        except OSError as exc:
            raise RemoteError(f"{node}: cannot fetch {remote}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def sftp_fetch(
    node: str, sftp: paramiko.SFTPClient, remote: str, remote_path: str, local_dir: Path
) -> None:
    """The node's folder ``remote`` into ``local_dir`` over SFTP, copying
    only files whose size or modification time differ. A lost connection
    (``SSHException``, ``EOFError``) is the caller's to handle."""
    try:
        if not stat.S_ISDIR(sftp.stat(remote).st_mode or 0):
            raise RemoteError(f"{node}: {remote_path} is not a folder")
    except FileNotFoundError:
        raise RemoteError(f"{node}: {remote_path} does not exist") from None
    try:
        sftp_get_tree(node, sftp, remote, local_dir, depth=0)
    except UnicodeDecodeError:
        # paramiko decodes names as UTF-8 while it lists a folder.
        raise UnsafeRemoteEntry(
            f"{node}: refused to fetch from {remote_path}: a file name there is not UTF-8"
        ) from None
    except OSError as exc:
        raise RemoteError(f"{node}: cannot fetch {remote_path}: {exc}") from None
