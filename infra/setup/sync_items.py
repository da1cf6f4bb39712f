"""What setup sends to a node (``sync_items``): this checkout's code
(``CODE_PATHS``, to ``layout.code``), each ``setup.sync`` path (relative
to the config file's folder; ``$VAR``, ``${VAR}`` and ``${VAR:-default}``
expanded from the environment) to ``<root>/<its basename>``, and, with
``run``/``exec``, the user's working folder (``workdir_item``) to
``<root>/work``, less what its filter keeps back (infra/setup/workdir.py)
and never the cluster's secrets (``secret_paths``).

Each is a ``SyncItem``: a local path, where it goes, and which of the
node's files under it are its own. How they are sent is sync.py.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from infra.config.loader import ClusterConfig
from infra.errors import ConfigError
from infra.providers.base import used_providers
from infra.setup.workdir import Secrets, WorkdirFilter, left_out, whole_machine
from infra.transport.base import NodeLayout

# The checkout whose trainer/ the nodes run.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# What of the checkout goes to layout.code: the trainer, and the node side
# of the cluster's bucket (the uploader, python -m infra.storage.uploader,
# which imports only infra/storage's node-safe modules).
CODE_PATHS = ("trainer", "infra/storage", "pyproject.toml")
# Basenames under <root> that tfcluster itself uses: a synced folder of the
# same name would overwrite them.
RESERVED = (
    "code",
    "venv",
    "runs",
    "logs",
    "work",
    "wheelhouse",
    "requirements.txt",
    "constraints.txt",
    "tensorboard",
)


@dataclass(frozen=True)
class SyncItem:
    """A local file or folder and where it goes on a node."""

    local: Path
    remote: str  # a layout-style path: relative to the login's home, or absolute
    # The user's working folder: only the files this filter keeps are sent,
    # and only those are deleted on the node when gone here (see
    # infra/setup/workdir.py). Such an item is synced with the hash manifest,
    # which applies the same filter on both sides.
    filter: WorkdirFilter | None = field(default=None, compare=False)
    # A setup.sync folder: what it keeps back (keys, credentials), which
    # neither the manifest nor rsync sends, and rsync deletes on the node.
    secrets: Secrets | None = field(default=None, compare=False)

    def files(self) -> Iterable[Path]:
        """The local files this item sends."""
        if self.local.is_file():
            return [self.local]
        if self.filter is not None:
            return self.filter.files()
        return sorted(_walk(self.local, self.secrets))

    def hidden(self, whole: bool) -> list[str]:
        """What this item keeps back, as rsync sees it: from the root of a
        transfer of its folder's contents (``whole``) or of the folder; a
        folder name (``.ssh/``) wherever it is."""
        if self.secrets is None or self.local.is_file():
            return []
        base = "/" if whole else f"/{self.local.name}/"
        inside = [base + rel for rel in self.secrets.inside(self.local)]
        return inside + [f"{name}/" for name in sorted(Secrets.FOLDERS)]

    def keeps(self, remote: str) -> bool:
        """Whether the node's file at ``remote`` (under this item) is one
        this item manages (so it may be replaced or deleted)."""
        if self.filter is None or remote == self.remote:
            return True
        return not self.filter.ignored(remote[len(self.remote) + 1 :])


_VAR = re.compile(r"\$(?:\{(\w+)(?::-([^}]*))?\}|(\w+))")


def expand_vars(value: str, key: str) -> str:
    """``$VAR``, ``${VAR}``, ``${VAR:-default}`` from the environment; an
    unset variable with no default is a ConfigError naming the key."""

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        default = match.group(2)
        got = os.environ.get(name)
        if got:
            return got
        if default is not None:
            return default
        raise ConfigError(
            f"{key}: {value!r} uses ${name}, which is not set; export {name} or edit the path"
        )

    return _VAR.sub(sub, value)


def sync_items(config: ClusterConfig, layout: NodeLayout) -> list[SyncItem]:
    """The checkout's code into layout.code, then each setup.sync path into
    ``<root>/<basename>``, less the secrets the working folder keeps back
    too (``setup.sync: ["."]`` once sent ssh.key_file)."""
    secrets = Secrets(secret_paths(config))
    items = [
        SyncItem(PROJECT_ROOT / name, f"{layout.code}/{name}")
        for name in CODE_PATHS
        if (PROJECT_ROOT / name).exists()
    ]
    seen: dict[str, str] = {}
    for entry in config.setup.sync:
        local = config.resolve(expand_vars(entry, "setup.sync"))
        if not local.exists():
            raise ConfigError(
                f"setup.sync: {entry!r} -> {local} does not exist "
                f"(relative paths are from {config.base_dir})"
            )
        if whole_machine(local):
            raise ConfigError(
                f"setup.sync: {entry!r} -> {local}: everything in it would go to the nodes "
                "(~/.ssh too); name the folders the nodes need"
            )
        name = local.name
        if name in RESERVED:
            raise ConfigError(
                f"setup.sync: {entry!r} would land on <remote_dir>/{name}, which tfcluster "
                "uses itself; rename the folder"
            )
        if name in seen:
            raise ConfigError(
                f"setup.sync: {entry!r} and {seen[name]!r} both land on <remote_dir>/{name}"
            )
        seen[name] = entry
        items.append(SyncItem(local, f"{layout.root}/{name}", secrets=secrets))
    return items


def workdir_item(local: Path, remote: str, secrets: Iterable[Path] = ()) -> SyncItem:
    """The user's working folder as a sync item; ``secrets`` (see
    ``secret_paths``) are never part of it."""
    if not local.is_dir():
        raise ConfigError(
            f"job.workdir: {local} is not a folder; pass --workdir with an existing folder"
        )
    return SyncItem(local, remote, WorkdirFilter(local, secrets))


def secret_paths(config: ClusterConfig) -> list[Path]:
    """The files the config names that must never leave this machine: the
    providers' (gce's service-account key), the bucket's key (a node that
    needs it gets its own copy, infra/cluster/bucket.py) and the SSH key (the filter
    itself always keeps tfcluster's state folder back)."""
    paths = [
        config.resolve(file)
        for provider in used_providers(config)
        for file in provider.secret_files(config)
    ]
    if config.ssh.key_file:
        paths.append(config.resolve(config.ssh.key_file))
    storage = config.storage
    if storage is not None and storage.credentials not in ("adc", "anonymous"):
        paths.append(config.resolve(storage.credentials))
    return paths


def _walk(folder: Path, secrets: Secrets | None = None) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if not _excluded(d) and not _kept(here / d, secrets)]
        for name in filenames:
            if not _excluded(name) and not _kept(here / name, secrets, is_dir=False):
                yield here / name


def _kept(path: Path, secrets: Secrets | None, *, is_dir: bool = True) -> bool:
    """Whether ``secrets`` keeps ``path`` back (said once, here)."""
    why = secrets.why(path, is_dir) if secrets is not None else None
    if why is not None:
        left_out(path, str(path), why)
    return why is not None


def _excluded(name: str) -> bool:
    return name == "__pycache__" or name.endswith(".pyc") or name == ".DS_Store"
