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
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePosixPath

import pathspec

from infra.errors import ConfigError
from infra.state import tfcluster_home

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


def unsendable(name: str) -> bool:
    """A name with a line break (``\\n``, ``\\r``, or any other that
    ``str.splitlines`` splits at): the sync's manifest, ``sha256sum -c`` and
    ``find`` speak one path per line, so such a file would silently never
    arrive (and make every sync compare again). It is left out, loudly."""
    return bool(name) and name.splitlines() != [name]


class WorkdirFilter:
    """Which paths (relative, posix) of one working folder are sent.

    Never the user's home or ``/`` as a whole (``run`` from ``~`` without
    --workdir would send every file there, ~/.ssh too), and never
    tfcluster's state folder (the clusters' private keys) wherever it is."""

    def __init__(self, root: Path, secrets: Iterable[Path] = ()) -> None:
        if root.resolve() in (Path("/"), Path.home().resolve()):
            raise ConfigError(
                f"working folder {str(root)[:60]!r}: everything in it would go to the nodes; "
                "pass --workdir (or set job.workdir) with your project's folder"
            )
        self.root = root
        # Files and folders never sent, wherever they are or are linked
        # from: tfcluster's own state (keys, known hosts) and the
        # credentials the cluster config names. The working folder defaults
        # to the one that holds cluster.yaml, where a service-account key
        # often sits too; a node must never receive it.
        self.secrets = {Path(os.path.realpath(p)) for p in (tfcluster_home(), *secrets)}
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
        """The regular files to send. Symlinks to files are sent as their
        content; symlinked folders are not followed (one could loop, or
        reach far outside)."""
        for dirpath, dirnames, filenames in os.walk(self.root):
            here = Path(dirpath)
            rel_dir = here.relative_to(self.root)
            kept = []
            for d in sorted(dirnames):
                rel = (rel_dir / d).as_posix()
                if unsendable(d):
                    log.warning("not syncing %r: a line break in its name", rel[:60])
                elif (here / d).is_symlink():
                    log.warning("not syncing %s: a symlinked folder", rel)
                elif self._secret(here / d):
                    log.warning("not syncing %s: it holds tfcluster's keys or credentials", rel)
                elif (here / d / "pyvenv.cfg").exists():
                    continue  # a virtualenv, whatever its name
                elif not self._ignored_here(PurePosixPath(rel), True):
                    kept.append(d)
            dirnames[:] = kept
            for name in sorted(filenames):
                rel = (rel_dir / name).as_posix()
                if unsendable(name):
                    log.warning("not syncing %r: a line break in its name", rel[:60])
                    continue
                if self._ignored_here(PurePosixPath(rel), False):
                    continue
                if self._secret(here / name):
                    log.warning("not syncing %s: a credentials file of this cluster", rel)
                    continue
                if (here / name).is_file():  # follows a symlink; skips sockets, FIFOs
                    yield here / name

    def _secret(self, path: Path) -> bool:
        """Whether ``path`` (or, through links, what it points to) is a
        secret or inside one."""
        if not self.secrets:
            return False
        real = Path(os.path.realpath(path))
        return any(real == s or s in real.parents for s in self.secrets)
