"""Sync: the checkout's code, ``setup.sync`` data and the working folder, to the nodes.

**What** (``SyncItem``s: the checkout's code, ``setup.sync`` paths, the
working folder) is infra/setup/sync_items.py.

**How** (incremental): only changed files move. A quick check of sizes
and mtimes (``sync_stale``) first; then rsync over the cluster's SSH (its
key, its pinned host keys) when both ends have rsync; else a manifest of
SHA-256 hashes is checked on the node (``sha256sum -c``) and a tar of what
differs is sent. Files gone locally are deleted on the node;
``__pycache__`` is left alone. The shell text is in
``infra/setup/commands.py``, its parsers in ``infra/setup/facts.py``.
"""

from __future__ import annotations

import hashlib
import tarfile
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from infra.errors import RemoteError
from infra.setup.commands import apply_command, compare_command, rel_to_base, rsync_args
from infra.setup.facts import Comparison, SyncStats, parse_compare, parse_rsync
from infra.setup.sync_items import SyncItem
from infra.transport.base import Transport

SYNC_TIMEOUT_S = 1800.0


# -- what is where: listings and manifests -------------------------------------------


def local_listing(items: Sequence[SyncItem]) -> dict[str, tuple[int, int]]:
    """What ``parse_listing`` should read once the node is in sync: rsync -a
    and the tar fallback (PAX headers) both keep mtimes below the second, so
    size + mtime is rsync's own quick check, done without starting rsync."""
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        for file in item.files():
            rel = file.relative_to(item.local).as_posix() if file != item.local else ""
            st = file.stat()
            millis = st.st_mtime_ns // 1_000_000
            out[f"{item.remote}/{rel}" if rel else item.remote] = (st.st_size, millis)
    return out


def _under(listing: Mapping[str, tuple[int, int]], item: SyncItem) -> dict[str, tuple[int, int]]:
    """The part of a listing that ``item`` manages: at or below its remote
    path, less what its filter leaves alone."""
    prefix = item.remote
    return {
        k: v
        for k, v in listing.items()
        if (k == prefix or k.startswith(prefix + "/")) and item.keeps(k)
    }


def in_sync(
    remote: Mapping[str, tuple[int, int]] | None, local: Mapping[str, tuple[int, int]]
) -> bool:
    """Same files, same sizes, mtimes within 2 ms (float rounding on the
    way through tar headers and ``find -printf``). A miss only costs the
    sync proper, which finds nothing to send."""
    if remote is None or remote.keys() != local.keys():
        return False
    return all(
        remote[k][0] == size and abs(remote[k][1] - millis) <= 2
        for k, (size, millis) in local.items()
    )


@dataclass(frozen=True)
class LocalFile:
    path: Path
    sha256: str
    size: int
    mtime: float
    # Sent as the content of what it links to: the working folder's links to
    # its own files (its filter let no other link through). Elsewhere a
    # link is sent as a link, as rsync -a does.
    follow: bool = False


def local_manifest(items: Sequence[SyncItem]) -> dict[str, LocalFile]:
    """Remote path -> the local file that belongs there, with its hash."""
    out: dict[str, LocalFile] = {}
    for item in items:
        for file in item.files():
            rel = file.relative_to(item.local).as_posix() if file != item.local else ""
            remote = f"{item.remote}/{rel}" if rel else item.remote
            out[remote] = _hashed(file, follow=item.filter is not None)
    return out


def _hashed(file: Path, *, follow: bool = False) -> LocalFile:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    st = file.stat()
    return LocalFile(file, digest.hexdigest(), st.st_size, st.st_mtime, follow)


def manifest_text(manifest: Mapping[str, LocalFile]) -> str:
    """``sha256sum -c`` input: ``HASH  PATH`` per file."""
    return "".join(f"{f.sha256}  {remote}\n" for remote, f in sorted(manifest.items()))


def build_archive(manifest: Mapping[str, LocalFile], paths: Iterable[str], out: IO[bytes]) -> int:
    """A tar.gz of the local files for ``paths`` (remote paths; names in the
    archive are relative to ``_base``); returns their total size."""
    total = 0
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        for remote in sorted(paths):
            local = manifest[remote]
            with open(local.path, "rb") as handle:
                # A followed link: the file it opens (fstat), not the link.
                info = tar.gettarinfo(
                    fileobj=handle if local.follow else None,
                    name=None if local.follow else str(local.path),
                    arcname=rel_to_base(remote),
                )
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                tar.addfile(info, handle if info.isreg() else None)
            total += local.size
    return total


# -- doing it ---------------------------------------------------------------------------


def sync_stale(
    transport: Transport,
    node: str,
    items: Sequence[SyncItem],
    listing: Mapping[str, tuple[int, int]] | None,
    *,
    rsync: bool,
) -> tuple[SyncStats, str]:
    """Bring ``items`` up to date on ``node``, given the node's ``listing``
    (``parse_listing`` of the probe); (what moved, method used).

    The quick check first: items whose files all match in size and mtime
    are there already (the common ``train`` case: all of them), and cost no
    rsync process and no second round trip."""
    local = local_listing(items)
    stale = [
        item
        for item in items
        if listing is None or not in_sync(_under(listing, item), _under(local, item))
    ]
    if not stale:
        return SyncStats(), "quick check"
    plain = [i for i in stale if i.filter is None]
    filtered = [i for i in stale if i.filter is not None]
    stats, method = sync_to_node(transport, node, plain, rsync=rsync)
    if filtered:
        stats = stats + _manifest_sync(transport, node, filtered)
        method = "manifest" if not plain else f"{method} + manifest"
    return stats, method


def sync_to_node(
    transport: Transport,
    node: str,
    items: Sequence[SyncItem],
    *,
    rsync: bool,
    contents: bool = False,
) -> tuple[SyncStats, str]:
    """Bring ``items`` up to date on ``node``; (what moved, method used).
    ``contents``: a single folder item whose contents form its remote folder
    (the wheelhouse); otherwise each item lands under its remote parent."""
    if not items:
        return SyncStats(), "rsync" if rsync else "manifest"
    if rsync:
        stats = SyncStats()
        for dest, group, whole in _rsync_groups(items, contents):
            target = transport.rsync_remote(node, dest + ("/" if not whole else ""))
            sources = [i.local for i in group]
            hidden = sorted({p for i in group for p in i.hidden(whole)})
            args = rsync_args(sources, "", contents=whole, hidden=hidden)
            out = transport.rsync(node, [*args, target], timeout=SYNC_TIMEOUT_S)
            stats = stats + parse_rsync(out)
        return stats, "rsync"
    return _manifest_sync(transport, node, items), "manifest"


def _rsync_groups(
    items: Sequence[SyncItem], contents: bool
) -> list[tuple[str, list[SyncItem], bool]]:
    """(remote folder, items, contents-mode) per rsync call: items whose
    basename is kept share one call per remote parent folder."""
    groups: dict[str, list[SyncItem]] = {}
    single: list[tuple[str, list[SyncItem], bool]] = []
    for item in items:
        parent, _, name = item.remote.rpartition("/")
        if contents or name != item.local.name or not parent:
            single.append((item.remote, [item], True))
        else:
            groups.setdefault(parent, []).append(item)
    return [(dest, group, False) for dest, group in groups.items()] + single


def _manifest_sync(transport: Transport, node: str, items: Sequence[SyncItem]) -> SyncStats:
    layout = transport.layout(node)
    manifest = local_manifest(items)
    manifest_file = f"{layout.root}/.tfcluster-manifest"
    transport.upload(node, manifest_text(manifest).encode(), manifest_file)
    result = transport.run(node, compare_command(layout, manifest_file, items), timeout=600)
    if not result.ok:
        raise RemoteError(f"{node}: comparing files failed: {result.tail()}")
    send, stale = sync_decision(manifest, parse_compare(result.stdout, layout), items)
    if not send and not stale:
        return SyncStats()
    archive = stale_list = dirs_list = None
    size = 0
    if send:
        archive = f"{layout.root}/.tfcluster-sync.tar.gz"
        with tempfile.NamedTemporaryFile(prefix="tfcluster-sync-", suffix=".tar.gz") as tmp:
            size = build_archive(manifest, send, tmp)
            tmp.flush()
            transport.upload(node, Path(tmp.name), archive)
    if stale:
        stale_list = f"{layout.root}/.tfcluster-stale"
        transport.upload(node, _nul_list(stale), stale_list)
        if dirs := emptied_dirs(stale, items):
            dirs_list = f"{layout.root}/.tfcluster-stale-dirs"
            transport.upload(node, _nul_list(dirs), dirs_list)
    done = transport.run(node, apply_command(layout, archive, stale_list, dirs_list), timeout=600)
    if not done.ok:
        raise RemoteError(f"{node}: unpacking the synced files failed: {done.tail()}")
    return SyncStats(len(send), size, len(stale))


def _nul_list(paths: Iterable[str]) -> bytes:
    """Paths for ``xargs -0`` on the node: any byte but NUL may be in a name."""
    return b"".join(rel_to_base(p).encode() + b"\0" for p in paths)


def sync_decision(
    manifest: Mapping[str, LocalFile], comparison: Comparison, items: Sequence[SyncItem]
) -> tuple[list[str], list[str]]:
    """(the files to send, the stale files to delete on the node): what
    differs there and exists here, and what is there but gone here, among
    the files the items manage (never a node's own, ignored ones)."""
    send = sorted(p for p in comparison.changed if p in manifest)
    stale = sorted(p for p in comparison.present - set(manifest) if _managed(p, items))
    return send, stale


def emptied_dirs(stale: Iterable[str], items: Sequence[SyncItem]) -> list[str]:
    """The folders deleting ``stale`` may leave empty, deepest first: each
    below the root of its item, never the root itself."""
    dirs: set[str] = set()
    for path in stale:
        root = next((i.remote for i in items if path.startswith(i.remote + "/")), None)
        parent = path.rpartition("/")[0]
        while root is not None and parent.startswith(root + "/"):
            dirs.add(parent)
            parent = parent.rpartition("/")[0]
    return sorted(dirs, key=lambda d: (-d.count("/"), d))


def _managed(remote: str, items: Sequence[SyncItem]) -> bool:
    """Whether the node's file ``remote`` belongs to an item that manages it."""
    for item in items:
        if remote == item.remote or remote.startswith(item.remote + "/"):
            return item.keeps(remote)
    return False
