"""What decides a node's venv (``InstallPlan``) and its fingerprint.

Its own module, below both its users: ``infra/setup/commands.py`` writes
the plan into the install's shell text, ``infra/setup/install.py`` runs it (and
``infra/setup/nodes.py`` decides which plan a config gets).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

MARKER_VERSION = "1"  # bump when the meaning of the fingerprint changes


@dataclass(frozen=True)
class InstallPlan:
    """Everything that decides what a node's venv holds."""

    requirements: str  # the requirements text installed (GPU swap applied)
    python: str  # the interpreter that makes the venv (setup.python)
    wheels: tuple[tuple[str, int], ...] | None  # wheelhouse listing (name, size); None = PyPI
    commands: tuple[str, ...]  # setup.commands, run after pip
    gpu: bool  # tensorflow[and-cuda] instead of tensorflow-cpu
    wheelhouse: Path | None = field(default=None, compare=False)  # the local folder
    # constraints.txt (pip -c) with the default requirements: every package
    # of the venv, dependencies too, at the version CI tested.
    constraints: str = ""
    # The node image's own TensorFlow (a Deep Learning VM image) is the pinned
    # version: the venv sees it (--system-site-packages) and pip skips it.
    system_tf: bool = False
    # Requirements installed after the others with `pip install --no-deps`
    # (trainer/requirements-no-deps.txt, with the default requirements).
    no_deps: str = ""

    @property
    def fingerprint(self) -> str:
        """The install marker's content: equal fingerprints, equal venvs."""
        data = {
            "v": MARKER_VERSION,
            "requirements": self.requirements,
            "python": self.python,
            "wheels": [list(w) for w in self.wheels] if self.wheels is not None else None,
            "commands": list(self.commands),
            "gpu": self.gpu,
        }
        if self.constraints:
            data["constraints"] = self.constraints
        if self.system_tf:  # only then: existing markers (BAKE_VENV images) stay valid
            data["system_tf"] = True
        if self.no_deps:
            data["no_deps"] = self.no_deps
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()

    @property
    def tensorflow(self) -> str | None:
        """The pinned TensorFlow version of the requirements."""
        match = _TF_LINE.search(self.requirements)
        return match.group("version") if match else None

    def with_system_tf(self) -> InstallPlan:
        """This plan on a node whose own Python has the pinned TensorFlow:
        the TensorFlow line goes (minutes of download and install saved)."""
        return replace(self, requirements=_TF_LINE.sub("", self.requirements), system_tf=True)


_TF_LINE = re.compile(
    r"^\s*tensorflow(?:-cpu)?(?:\[[a-z-]+\])?\s*==\s*(?P<version>[0-9][^\s;#]*)[^\n]*\n?",
    re.MULTILINE,
)
