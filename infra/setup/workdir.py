"""The user's working folder: which of its files go to the nodes.

``deploy.py run`` and ``exec`` run the user's program in a copy of their
working folder on every node. What is *not* sent: version-control folders,
virtualenvs (any folder with a ``pyvenv.cfg``: they hold this machine's
interpreter, useless on a node, and are large), tfcluster's own ``runs/``
results folder at the top, caches, and whatever the folder's ``.gitignore``
files exclude (git's rules, each file for its own folder and below, the
deepest match deciding).

The same rule is applied to what the node already has, so that a sync
deletes there only files that would have been sent and are gone here:
files the node's program wrote into ignored places stay.

Never sent from any folder (``Secrets``: ``setup.sync`` folders too):
tfcluster's own state, the credentials the config names, ``.ssh`` and
``.gnupg``. A symlink is sent as the file it points to when that is inside
the working folder (and not itself left out), and left out otherwise; a name the sync cannot carry
(a line break, not UTF-8) is left out. Each is said once.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

import pathspec

from infra.errors import ConfigError
from infra.state.folder import tfcluster_home

log = logging.getLogger("tfcluster")

# Folder names never sent, wherever they are.
ALWAYS_IGNORED_DIRS = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".mypy_cache", ".pytest_cache", ".ruff_cache",
     ".ipynb_checkpoints", ".tox", ".nox", ".venv", "venv",
     ".ssh", ".gnupg"}  # private keys, should a home folder be the working folder
)  # fmt: skip
# File names never sent.
ALWAYS_IGNORED_FILES = frozenset({".DS_Store"})
ALWAYS_IGNORED_SUFFIXES = (".pyc",)
# Top-level folders never sent: tfcluster's results land in runs/.
TOP_IGNORED_DIRS = frozenset({"runs"})


_said: set[tuple[str, str]] = set()
_said_lock = threading.Lock()


def left_out(path: Path, shown: str, why: str) -> None:
    """Warn that ``path`` (shown as ``shown``) is not synced, once per
    process: each sync lists the folder twice (the quick check, the
    manifest), and once per node."""
    with _said_lock:
        if (str(path), why) in _said:
            return
        _said.add((str(path), why))
    log.warning("not syncing %s: %s", shown, why)


def unsendable(name: str) -> bool:
    """A name the sync cannot carry (see ``unsendable_why``)."""
    return unsendable_why(name) is not None


def unsendable_why(name: str) -> str | None:
    """Why a file of this name cannot travel, or None. A line break
    (``\\n``, ``\\r``, or any other that ``str.splitlines`` splits at):
    the sync's manifest, ``sha256sum -c`` and ``find`` speak one path per
    line, so such a file would silently never arrive (and make every sync
    compare again). Bytes that are not UTF-8 (Python reads them as lone
    surrogates, which no manifest can write: ``run`` exited 70) and the
    replacement character (what a node's non-UTF-8 name reads as here):
    the node's listing could never name it again. Either is left out,
    loudly, on both sides."""
    if name and name.splitlines() != [name]:
        return "a line break in its name"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "its name is not UTF-8; rename it"
    if "\ufffd" in name:
        return "its name is not UTF-8; rename it"
    return None


def whole_machine(root: Path) -> bool:
    """``/`` or the user's home: never synced as a whole (every file there
    would go, ~/.ssh and ~/.tfcluster with every cluster's key too)."""
    return root.resolve() in (Path("/"), Path.home().resolve())


class Secrets:
    """What never leaves this machine, whatever folder it is synced from
    (the working folder, a ``setup.sync`` path), or linked from: tfcluster's
    own state (keys, known hosts), the credentials the cluster config names,
    and private-key folders (``.ssh``, ``.gnupg``)."""

    FOLDERS = frozenset({".ssh", ".gnupg"})

    def __init__(self, paths: Iterable[Path] = ()) -> None:
        self.paths = {Path(os.path.realpath(p)) for p in (tfcluster_home(), *paths)}

    def why(self, path: Path, is_dir: bool) -> str | None:
        """Why ``path`` is kept back, or None."""
        if is_dir and path.name in self.FOLDERS:
            return "a private-key folder"
        real = Path(os.path.realpath(path))
        if any(real == s or s in real.parents for s in self.paths):
            return "it holds tfcluster's keys or credentials" if is_dir else (
                "a credentials file of this cluster"
            )
        return None

    def inside(self, folder: Path) -> list[str]:
        """The secrets inside ``folder`` (not through links), relative."""
        real = Path(os.path.realpath(folder))
        return sorted(s.relative_to(real).as_posix() for s in self.paths if real in s.parents)


class WorkdirFilter:
    """Which paths (relative, posix) of one working folder are sent.

    Never the user's home or ``/`` as a whole (``run`` from ``~`` without
    --workdir would send every file there, ~/.ssh too), and never
    tfcluster's state folder (the clusters' private keys) wherever it is."""

    def __init__(self, root: Path, secrets: Iterable[Path] = ()) -> None:
        if whole_machine(root):
            raise ConfigError(
                f"working folder {str(root)[:60]!r}: everything in it would go to the nodes; "
                "pass --workdir (or set job.workdir) with your project's folder"
            )
        self.root = root
        self.real_root = Path(os.path.realpath(root))
        # Files and folders never sent, wherever they are or are linked
        # from: tfcluster's own state (keys, known hosts) and the
        # credentials the cluster config names. The working folder defaults
        # to the one that holds cluster.yaml, where a service-account key
        # often sits too; a node must never receive it.
        self.secrets = Secrets(secrets)
        # folder (relative, "" = top) -> its .gitignore, read once
        self._specs: dict[str, pathspec.GitIgnoreSpec | None] = {}

    def _spec(self, folder: str) -> pathspec.GitIgnoreSpec | None:
        if folder not in self._specs:
            file = self.root / folder / ".gitignore"
            spec = None
            if file.is_file() and not file.is_symlink():
                try:
                    lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
                    spec = pathspec.GitIgnoreSpec.from_lines(lines)
                except (OSError, ValueError, re.error) as exc:  # a pattern pathspec cannot read
                    log.warning("ignoring %s: %s", file, exc)
            self._specs[folder] = spec
        return self._specs[folder]

    def _ignored_here(self, rel: PurePosixPath, is_dir: bool) -> bool:
        """Whether ``rel`` itself is ignored, its parents aside."""
        name = rel.name
        if unsendable(name):
            return True
        if is_dir and (
            name in ALWAYS_IGNORED_DIRS or (len(rel.parts) == 1 and name in TOP_IGNORED_DIRS)
        ):
            return True
        if not is_dir and (name in ALWAYS_IGNORED_FILES or name.endswith(ALWAYS_IGNORED_SUFFIXES)):
            return True
        decision: bool | None = None
        parents = [PurePosixPath(*rel.parts[:i]) for i in range(len(rel.parts))]
        for folder in parents:  # top first: the deepest .gitignore that matches wins
            spec = self._spec("" if str(folder) == "." else str(folder))
            if spec is None:
                continue
            inside = rel.relative_to(folder).as_posix() + ("/" if is_dir else "")
            result = spec.check_file(inside)
            if result.include is not None:
                decision = result.include
        return bool(decision)

    def ignored(self, rel: str, is_dir: bool = False) -> bool:
        """Whether the path ``rel`` (relative to the folder) is left out:
        itself, or one of the folders it is in (git cannot re-include a
        file inside an excluded folder either)."""
        path = PurePosixPath(rel)
        for i in range(1, len(path.parts)):
            if self._ignored_here(PurePosixPath(*path.parts[:i]), True):
                return True
        return self._ignored_here(path, is_dir)

    def files(self) -> Iterator[Path]:
        """The files to send. A symlink to a file inside the working folder
        is sent as that file's content (a link would arrive dangling, and be
        sent again at every sync); one to anything outside is left out with
        a warning, and symlinked folders are not followed (one could loop,
        or reach far outside)."""
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            rel_dir = here.relative_to(self.root)
            kept = []
            for d in sorted(dirnames):
                rel = (rel_dir / d).as_posix()
                if why := unsendable_why(d):
                    left_out(here / d, repr(rel[:60]), why)
                elif (here / d).is_symlink():
                    left_out(here / d, rel, "a symlinked folder")
                elif why := self.secrets.why(here / d, True):
                    left_out(here / d, rel, why)
                elif (here / d / "pyvenv.cfg").exists():
                    continue  # a virtualenv, whatever its name
                elif not self._ignored_here(PurePosixPath(rel), True):
                    kept.append(d)
            dirnames[:] = kept
            for name in sorted(filenames):
                if (file := self._sendable(here / name, (rel_dir / name).as_posix())) is not None:
                    yield file

    def _sendable(self, path: Path, rel: str) -> Path | None:
        """``path`` if it is to be sent; each reason it is not, said once."""
        if why := unsendable_why(path.name):
            left_out(path, repr(rel[:60]), why)
            return None
        if self._ignored_here(PurePosixPath(rel), False):
            return None
        if why := self.secrets.why(path, False):
            left_out(path, rel, why)
            return None
        if path.is_symlink():
            target = Path(os.path.realpath(path))
            if self.real_root not in target.parents:
                left_out(path, rel, "a symlink to outside the working folder")
                return None
            if not target.is_file():
                left_out(path, rel, "a symlink to no file")
                return None
            if self.ignored(target.relative_to(self.real_root).as_posix()):
                # Its content would go under the link's name: a key in .ssh/,
                # a file .gitignore keeps here.
                left_out(path, rel, "a symlink to a file that is not synced")
                return None
            return path
        return path if path.is_file() else None  # skips sockets, FIFOs
