"""Bringing a node's folder here, without trusting the node.

``SshTransport.fetch`` (``infra/transport/ssh.py``) copies a run folder home with
rsync (``rsync_fetch_args``, then ``_merge_staged``) or SFTP
(``SftpFetch``). Either way the node names the entries, so only plain
files and folders whose names are one plain path component arrive, each
inside the destination: a name with ``/`` or ``..``, a symlink or a special
file fails the fetch (``UnsafeRemoteEntry`` naming the node and the entry)
before anything is written for it, and nothing is ever written through a
symlink here.

Nor is the node trusted with this machine's disk and time (``FetchLimits``,
cluster.yaml's ``fetch``): the run folder may hold at most ``max_bytes``
and ``max_entries``, and a node silent for ``timeout`` seconds fails the
fetch; each is one ``FetchLimitExceeded`` line naming the node and the
file. Over SFTP a file is read up to its declared size and no further
(paramiko's ``getfo`` read on to whatever end the node chose), into a
``.tfcluster-fetch-*`` file renamed into place only once whole, and removed
otherwise; files fetched whole before a limit was met stay. rsync writes
into a fresh ``.tfcluster-fetch-*`` folder that ``StagingWatch`` measures
while it runs (stopping rsync past a limit: its receiver writes whatever
the node's rsync sends) and that is moved into place only once complete,
and otherwise removed: a refused rsync fetch leaves nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path, PurePosixPath
from typing import BinaryIO

import paramiko

from infra.config.schema import FetchLimits
from infra.errors import FetchLimitExceeded, RemoteError, UnsafeRemoteEntry

# A fetched tree deeper than this is a node answering every listing with
# another folder (it would end in a RecursionError, a traceback).
MAX_FETCH_DEPTH = 64
# The fresh folder an rsync fetch lands in, and the name a file has over
# SFTP until it is whole, inside the destination.
STAGING_PREFIX = ".tfcluster-fetch-"
# Bytes asked of the node per SFTP read, and reads in flight at once.
_CHUNK = 1 << 20
_IN_FLIGHT = 64
# rsync's temporary name for a file it receives: ".<name>.XXXXXX".
_RSYNC_TEMP = re.compile(r"^\.(.+)\.[A-Za-z0-9]{6}$")
_LIMIT_HINT = (
    "if the run folder really is that large (or the node that slow), raise it in "
    "cluster.yaml's fetch section and `deploy.py fetch` again; otherwise check {node}"
)


def _shown(path: str) -> str:
    # The end of a long path: the entry's own name is what matters.
    return path if len(path) <= 120 else "..." + path[-117:]


def too_big(node: str, path: str, limits: FetchLimits) -> FetchLimitExceeded:
    return FetchLimitExceeded(
        f"{node}: {_shown(path)!r} takes the run folder past {limits.max_bytes / 1e9:g} GB "
        "(fetch.max_gb); it was not kept",
        hint=_LIMIT_HINT.format(node=node),
    )


def too_many(node: str, path: str, limits: FetchLimits) -> FetchLimitExceeded:
    return FetchLimitExceeded(
        f"{node}: {_shown(path)!r} takes the run folder past {limits.max_entries} files and "
        "folders (fetch.max_entries); it was not kept",
        hint=_LIMIT_HINT.format(node=node),
    )


def silent(node: str, path: str, limits: FetchLimits) -> FetchLimitExceeded:
    return FetchLimitExceeded(
        f"{node}: no answer for {limits.timeout:g} s while fetching {_shown(path)!r} "
        "(fetch.timeout)",
        hint=_LIMIT_HINT.format(node=node),
    )


def rsync_fetch_args(source: str, staging: Path, previous: Path, timeout: float) -> list[str]:
    """rsync flags to pull the node folder ``source`` (``user@host:dir/``)
    into the fresh folder ``staging``.

    Recursive with times only: without ``-l``/``-D`` (what ``-a`` implies)
    rsync skips the node's symlinks, devices and fifos instead of making
    them here, and without ``-p``/``-o``/``-g`` the node picks no modes or
    owners (no setuid file from it). ``--link-dest`` makes every file that
    is unchanged from ``previous`` (the destination: the last fetch) a
    hard link of it, so only changes cross the network. ``-s`` sends the
    remote path through rsync's protocol, not the node's shell; ``--``
    ends the options, so no path is ever read as one. ``--timeout``: a
    node silent that long ends rsync (its exit code 30)."""
    return [
        "--recursive",
        "--times",
        "--safe-links",  # no-op without -l; stays right if -l is ever added
        "-s",
        f"--timeout={max(1, round(timeout))}",
        f"--link-dest={previous.resolve()}",
        "--",
        source,
        f"{staging}/",
    ]


def _refuse(node: str, path: str, why: str, hint: str | None = None) -> UnsafeRemoteEntry:
    return UnsafeRemoteEntry(
        f"{node}: refused to fetch {_shown(path)!r}: {why}",
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


class SftpFetch:
    """One folder of a node brought here over SFTP, within ``limits``:
    entries and declared sizes counted as the listings come, each file
    read up to its declared size."""

    def __init__(self, node: str, sftp: paramiko.SFTPClient, limits: FetchLimits) -> None:
        self.node, self.sftp, self.limits = node, sftp, limits
        self.entries = 0
        self.bytes = 0
        # What is being asked of the node now: the file a silence names.
        self.current = ""

    def tree(self, remote: str, local: Path, *, depth: int = 0) -> None:
        if depth > MAX_FETCH_DEPTH:
            raise _refuse(self.node, remote, f"folders nest more than {MAX_FETCH_DEPTH} deep")
        # Every name of the folder is checked (and counted) before any of
        # them is written; a listing longer than the limit is not read on.
        self.current = remote
        entries = []
        for entry in self.sftp.listdir_iter(remote):
            name = _plain_name(self.node, remote, entry.filename)
            self.entries += 1
            if self.entries > self.limits.max_entries:
                raise too_many(self.node, f"{remote}/{name}", self.limits)
            entries.append((name, entry))
        for name, entry in entries:
            source = str(PurePosixPath(remote) / name)
            dest = local / name
            mode = entry.st_mode or 0
            if stat.S_ISDIR(mode):
                _local_folder(self.node, source, dest)
                self.tree(source, dest, depth=depth + 1)
            elif stat.S_ISREG(mode):
                self.file(source, dest, entry)
            else:
                raise _refuse(self.node, source, f"it is {_kind(mode)}, not a plain file or folder")

    def file(self, source: str, dest: Path, entry: paramiko.SFTPAttributes) -> None:
        """One file, unless the same size and time are here already; written
        to a new temporary file and renamed over ``dest`` (which replaces a
        symlink there instead of writing through it)."""
        size = entry.st_size
        if size is None or size < 0:
            raise _refuse(self.node, source, "the node gave no size for it")
        self.bytes += size
        if self.bytes > self.limits.max_bytes:
            raise too_big(self.node, source, self.limits)
        try:
            have = dest.lstat()
            if (
                stat.S_ISREG(have.st_mode)
                and have.st_size == size
                and int(have.st_mtime) == entry.st_mtime
            ):
                return
        except FileNotFoundError:
            pass
        self.current = source
        # A new name (O_EXCL: nothing there to follow), modes as umask says.
        part = dest.parent / f"{STAGING_PREFIX}{secrets.token_hex(8)}"
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(fd, "wb") as out:
                self._read(source, out, size)
            if entry.st_mtime is not None:
                os.utime(part, (entry.st_atime or entry.st_mtime, entry.st_mtime))
            os.replace(part, dest)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part)
            raise

    def _read(self, source: str, out: BinaryIO, size: int) -> None:
        """The first ``size`` bytes of ``source`` (fewer if it ends first:
        it shrank, and the next fetch sees another size): reads are asked
        for up to ``size`` only, whatever the node would send after."""
        remote = self.sftp.open(source, "rb")
        remote.prefetch(size, max_concurrent_requests=_IN_FLIGHT)
        left = size
        while left > 0:
            chunk = remote.read(min(left, _CHUNK))[:left]
            if not chunk:
                break
            out.write(chunk)
            left -= len(chunk)
        # Closed only here: after a silence, closing would wait once more
        # (the connection is dropped instead; the handle dies with it).
        remote.close()


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


class StagingWatch:
    """The limits, on what rsync has written into ``staging`` so far: called
    while rsync runs (``SshTransport.run_rsync``'s ``watch``) and once it is
    done. Raises ``FetchLimitExceeded`` naming the file that went past."""

    def __init__(self, node: str, remote: str, staging: Path, limits: FetchLimits) -> None:
        self.node, self.remote, self.staging, self.limits = node, remote, staging, limits

    def __call__(self) -> None:
        entries = total = 0
        for folder, dirs, files in os.walk(self.staging):
            for name in dirs + files:
                # rsync receives a file as ".<name>.XXXXXX": the node's name.
                where = f"{self.remote}/{Path(folder, name).relative_to(self.staging)}"
                if (temp := _RSYNC_TEMP.match(name)) is not None:
                    where = f"{where.rsplit('/', 1)[0]}/{temp.group(1)}"
                entries += 1
                if entries > self.limits.max_entries:
                    raise too_many(self.node, where, self.limits)
                with contextlib.suppress(FileNotFoundError):  # renamed meanwhile
                    total += Path(folder, name).lstat().st_size if name in files else 0
                if total > self.limits.max_bytes:
                    raise too_big(self.node, where, self.limits)


def run_watched(
    argv: Sequence[str], *, timeout: float | None, watch: Callable[[], None] | None
) -> subprocess.CompletedProcess[str]:
    """``argv`` (rsync) to its end, its output text, with ``watch`` called
    every quarter of a second meanwhile: what it raises (or a timeout,
    ``subprocess.TimeoutExpired``) stops the process and its children (its
    ssh: a process group of their own) and is raised."""
    deadline = None if timeout is None else time.monotonic() + timeout
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        while True:
            try:
                stdout, stderr = proc.communicate(timeout=0.25)
                break
            except subprocess.TimeoutExpired:
                if deadline is not None and time.monotonic() > deadline:
                    raise
                if watch is not None:
                    watch()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return subprocess.CompletedProcess(list(argv), proc.returncode, stdout, stderr)


def fetch_staged(
    node: str,
    remote: str,
    local_dir: Path,
    pull: Callable[[Path, Callable[[], None]], object],
    limits: FetchLimits,
) -> None:
    """``pull`` (an rsync, given a watch of the limits to call while it
    runs) into a fresh folder inside ``local_dir`` (nothing there for the
    node's names to meet: no old symlink to write through), check what
    arrived, then move it into place. Refused, it is all removed."""
    staging = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=local_dir))
    watch = StagingWatch(node, remote, staging, limits)
    try:
        pull(staging, watch)
        watch()  # what rsync left, exactly
        try:
            _merge_staged(node, staging, local_dir, remote)
        except OSError as exc:
            raise RemoteError(f"{node}: cannot fetch {remote}: {exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def sftp_fetch(
    node: str,
    sftp: paramiko.SFTPClient,
    remote: str,
    remote_path: str,
    local_dir: Path,
    limits: FetchLimits,
) -> None:
    """The node's folder ``remote`` into ``local_dir`` over SFTP, copying
    only files whose size or modification time differ, within ``limits``.
    A lost connection (``SSHException``, ``EOFError``) is the caller's to
    handle; so is the connection after a ``FetchLimitExceeded`` (drop it:
    replies may still be on their way)."""
    fetch = SftpFetch(node, sftp, limits)
    channel = sftp.get_channel()
    before = channel.gettimeout() if channel is not None else None
    if channel is not None:
        channel.settimeout(limits.timeout)
    try:
        fetch.current = remote
        try:
            if not stat.S_ISDIR(sftp.stat(remote).st_mode or 0):
                raise RemoteError(f"{node}: {remote_path} is not a folder")
        except FileNotFoundError:
            raise RemoteError(f"{node}: {remote_path} does not exist") from None
        fetch.tree(remote, local_dir)
    except UnicodeDecodeError:
        # paramiko decodes names as UTF-8 while it lists a folder.
        raise UnsafeRemoteEntry(
            f"{node}: refused to fetch from {remote_path}: a file name there is not UTF-8"
        ) from None
    except TimeoutError:
        raise silent(node, fetch.current, limits) from None
    except OSError as exc:
        raise RemoteError(f"{node}: cannot fetch {remote_path}: {exc}") from None
    finally:
        if channel is not None:
            channel.settimeout(before)
