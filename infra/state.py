"""The local, per-cluster state folder: a cache, never the truth.

``$TFCLUSTER_HOME/clusters/<name>/`` (default ``~/.tfcluster``) holds the
cluster's SSH key (mode 0600), its pinned host keys, the last known node
addresses and the last job. The provider's own view (GCE labels, the hosts
list, the process table) always wins: losing this folder loses nothing but
the SSH key, which ``up`` re-creates and re-installs.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def tfcluster_home() -> Path:
    return Path(os.environ.get("TFCLUSTER_HOME") or Path.home() / ".tfcluster")


class ClusterState:
    """Files of one cluster under ``tfcluster_home()/clusters/<name>``."""

    def __init__(self, name: str, home: Path | None = None) -> None:
        self.name = name
        self.dir = (home or tfcluster_home()) / "clusters" / name

    @property
    def file(self) -> Path:
        return self.dir / "state.json"

    @property
    def key_file(self) -> Path:
        """The per-cluster private key (ed25519); ``.pub`` beside it."""
        return self.dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """Host keys pinned on first contact, OpenSSH known_hosts format."""
        return self.dir / "known_hosts"

    @property
    def debug_log(self) -> Path:
        return self.dir / "debug.log"

    def ensure_dir(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.dir

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            # A missing or torn cache is rebuilt from the provider's view.
            return {}
        return data if isinstance(data, dict) else {}

    def update(self, **values: Any) -> dict[str, Any]:
        """Merge ``values`` into state.json atomically (a crash leaves the old file)."""
        data = self.load()
        data.update(values)
        self.ensure_dir()
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state-", suffix=".json")
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2, sort_keys=True)
        os.replace(tmp, self.file)
        return data

    def get(self, key: str, default: Any = None) -> Any:
        return self.load().get(key, default)
