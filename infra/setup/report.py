"""What setup did, per node: the report ``deploy.py up`` prints.

``NodeSetup`` is filled in as a node is installed and synced (by
``infra/setup/nodes.py``, ``infra/setup/install.py`` and ``infra/setup/sync.py``);
``SetupReport`` gathers them for the whole cluster. ``OnEvent`` is how the
steps tell the caller what they are doing while they do it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

OnEvent = Callable[[str, str], None]


@dataclass
class NodeSetup:
    """What setup did on one node."""

    node: str
    install: str = "skipped"  # installed | already installed | skipped | failed
    install_seconds: float = 0.0
    files: int = 0  # synced files sent (new or changed)
    bytes: int = 0
    deleted: int = 0
    method: str = ""  # rsync | manifest
    wheelhouse_files: int = 0  # wheels uploaded for the install
    requirements: bool = False  # the working folder's requirements.txt was installed
    system_tf: str | None = None  # the image's own TensorFlow, used instead of pip's
    gpus: int | None = None  # GPUs TensorFlow sees (GPU nodes only)
    seconds: float = 0.0
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.install == "installed" or self.requirements or bool(self.files or self.deleted)

    def line(self) -> str:
        if self.error:
            return f"{self.node}: FAILED: {self.error}"
        parts = []
        if self.install == "installed":
            parts.append(f"installed ({self.install_seconds:.0f} s)")
        elif self.install == "already installed":
            parts.append("already installed")
        if self.system_tf:
            parts.append(f"the image's TensorFlow {self.system_tf}")
        if self.gpus:
            parts.append(f"TensorFlow sees {self.gpus} GPU{'s' * (self.gpus != 1)}")
        if self.files or self.deleted:
            what = f"synced {self.files} file{'s' * (self.files != 1)} ({_size(self.bytes)})"
            if self.deleted:
                what += f", deleted {self.deleted}"
            parts.append(f"{what} via {self.method}")
        else:
            parts.append("code up to date")
        if self.requirements:
            parts.append("installed requirements.txt")
        line = f"{self.node}: " + ", ".join(parts)
        for warning in self.warnings:
            line += f"; warning: {warning}"
        return line


@dataclass
class SetupReport:
    """Per node, what install and sync did. ``deploy.py up`` prints ``lines()``."""

    nodes: dict[str, NodeSetup]
    seconds: float = 0.0

    @property
    def changed(self) -> bool:
        return any(n.changed for n in self.nodes.values())

    @property
    def failed(self) -> dict[str, NodeSetup]:
        return {name: n for name, n in self.nodes.items() if n.error}

    @property
    def files(self) -> int:
        return sum(n.files for n in self.nodes.values())

    def lines(self) -> list[str]:
        return [self.nodes[name].line() for name in sorted(self.nodes)]

    def as_dict(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "nodes": {k: asdict(v) for k, v in self.nodes.items()}}


def _size(n: int) -> str:
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"
