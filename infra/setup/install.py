"""Install: the Python environment a node runs the trainer with.

**Idempotent**: a virtualenv at ``layout.python``'s venv with the pinned
trainer requirements, python3-venv first if the image lacks it (a fresh
Debian VM does: ``sudo apt-get``), then ``setup.commands``. What was
installed is summed up in one fingerprint (``InstallPlan.fingerprint``: the
requirements text, the Python, the wheelhouse listing, the commands and the
GPU flag) that the install writes last, to ``<venv>/.tfcluster-install``;
a later ``up`` whose fingerprint matches installs nothing. The node image's
``BAKE_VENV=1`` build writes the same marker (``python -m tfcluster_cli.compose
marker``), so fresh containers start with nothing to install.

The venv is ``<setup.remote_dir>/venv`` (``layout.env``): on provider ssh
the clusters of one login share it (each keeps everything else in a folder
of its own), a lock on the node lets one install at a time, and an install
another cluster shares is never replaced by another one (one line: give
the cluster its own ``setup.remote_dir``).

With ``setup.wheelhouse`` (a local folder of wheels) the folder is copied to
``<env>/wheelhouse`` (incrementally) and pip installs with ``--no-index``:
nodes need no PyPI. On GPU nodes the node gets ``tensorflow[and-cuda]`` of
the pinned version instead of tensorflow-cpu (``gpu_requirements``).

When the node's own Python (``setup.python``) already has the pinned
TensorFlow (a Deep Learning VM image with TensorFlow), the venv is made with
``--system-site-packages`` and the TensorFlow line is left out of the install
(``InstallPlan.with_system_tf``): minutes saved per node.

With the default requirements, ``trainer/requirements-no-deps.txt``
(tf-keras) is installed after them with ``pip install --no-deps``: its
metadata asks for the ``tensorflow`` wheel, whose module tensorflow-cpu
already provides.

A working folder's own ``requirements.txt`` (``run``, ``exec``) goes into
the same venv (``install_user_requirements``). The shell text is in
``infra/setup/commands.py``, its parsers in ``infra/setup/facts.py``;
which plan a config gets is decided in ``infra/setup/nodes.py`` (``install_plan``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import time
from pathlib import Path

from infra.config.loader import ClusterConfig
from infra.errors import ConfigError, RemoteError
from infra.node import probes
from infra.node.facts import parse_system_tensorflow
from infra.setup.commands import FACT, install_command, user_requirements_command
from infra.setup.facts import parse_install
from infra.setup.install_plan import InstallPlan
from infra.setup.report import NodeSetup, OnEvent
from infra.setup.sync import sync_to_node
from infra.setup.sync_items import PROJECT_ROOT, SyncItem
from infra.transport.base import Transport

log = logging.getLogger("tfcluster")

# The default setup.requirements, and the exact versions it is installed with.
DEFAULT_REQUIREMENTS = "trainer/requirements.txt"
# With the default requirements: what is installed after them without its
# dependencies (tf-keras; the file says why).
NO_DEPS_REQUIREMENTS = PROJECT_ROOT / "trainer" / "requirements-no-deps.txt"
CONSTRAINTS = PROJECT_ROOT / "constraints.txt"
# A first install of TensorFlow from PyPI on a small VM takes minutes.
INSTALL_TIMEOUT_S = 1800.0


def gpu_requirements(text: str) -> str:
    """``tensorflow-cpu==X`` -> ``tensorflow[and-cuda]==X`` (same version)."""
    return re.sub(
        r"^(\s*)tensorflow-cpu(\s*[=<>!~].*)?$",
        lambda m: f"{m.group(1)}tensorflow[and-cuda]{m.group(2) or ''}",
        text,
        flags=re.MULTILINE,
    )


def requirements_file(config: ClusterConfig) -> Path:
    """setup.requirements: from the config file's folder, else (the default
    ``trainer/requirements.txt``) from this checkout, whose trainer is synced."""
    name = config.setup.requirements
    for candidate in (config.resolve(name), (PROJECT_ROOT / name).resolve()):
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"setup.requirements: {name} not found (looked in {config.base_dir} and {PROJECT_ROOT})"
    )


def wheelhouse_listing(folder: Path) -> tuple[tuple[str, int], ...]:
    """The wheels of a wheelhouse: (file name, size), sorted."""
    return tuple(
        sorted((p.name, p.stat().st_size) for p in folder.iterdir() if p.name.endswith(".whl"))
    )


# -- doing it ---------------------------------------------------------------------------


def install_venv(
    transport: Transport, node: str, config: ClusterConfig, plan: InstallPlan,
    report: NodeSetup,
    *,
    rsync: bool,
    on_event: OnEvent,
) -> InstallPlan:
    """Install ``plan`` on ``node``, whose venv is not current: the
    wheelhouse first (if any), then ``install_command``. Fills in
    ``report``; returns the plan installed (the image's TensorFlow may
    have replaced pip's)."""
    layout = transport.layout(node)
    plan = _image_tensorflow(transport, node, config, plan, report)
    started = time.monotonic()
    wheelhouse = _upload_wheelhouse(transport, node, plan, report, rsync=rsync, on_event=on_event)
    on_event(node, "installing the trainer's requirements (first time: minutes)")
    result = transport.run(
        node, install_command(layout, plan, wheelhouse), timeout=INSTALL_TIMEOUT_S
    )
    facts = parse_install(result.stdout)
    if not result.ok or not facts.done:
        raise RemoteError(f"{node}: install failed: {result.tail(5)}")
    if facts.gpu is False:
        report.warnings.append(
            "no working nvidia-smi: TensorFlow will not see the GPU until the "
            "NVIDIA driver is installed (see infra/setup/nodes.py)"
        )
    report.install = "installed"
    report.install_seconds = time.monotonic() - started
    on_event(node, f"installed in {report.install_seconds:.0f} s")
    return plan


def _upload_wheelhouse(
    transport: Transport,
    node: str,
    plan: InstallPlan,
    report: NodeSetup,
    *,
    rsync: bool,
    on_event: OnEvent,
) -> str | None:
    """The plan's wheelhouse into ``<root>/wheelhouse`` (incrementally);
    its path on the node, or None when pip installs from PyPI."""
    if plan.wheelhouse is None:
        return None
    on_event(node, f"uploading the wheelhouse ({len(plan.wheels or ())} wheels)")
    remote = f"{transport.layout(node).env}/wheelhouse"
    stats, _ = sync_to_node(
        transport, node, [SyncItem(plan.wheelhouse, remote)], rsync=rsync, contents=True
    )
    report.wheelhouse_files = stats.files
    return remote


def _image_tensorflow(
    transport: Transport,
    node: str,
    config: ClusterConfig,
    plan: InstallPlan,
    report: NodeSetup,
) -> InstallPlan:
    """``plan``, or its variant using the node's own TensorFlow when the
    image has exactly the pinned version (a Deep Learning VM image)."""
    want = plan.tensorflow
    if want is None:
        return plan
    result = transport.run(node, probes.system_tensorflow(config.setup.python), timeout=60)
    have = parse_system_tensorflow(result.stdout) if result.ok else None
    if have != want:
        if have is not None:
            log.info("%s: the image has TensorFlow %s, not %s: installing %s", node, have,
                     want, want)
        return plan
    report.system_tf = have
    return plan.with_system_tf()


def install_user_requirements(
    transport: Transport,
    node: str,
    config: ClusterConfig,
    item: SyncItem,
    on_event: OnEvent,
) -> bool:
    """The working folder's requirements.txt, if it sends one; whether
    anything was installed."""
    local = item.local / "requirements.txt"
    if not local.is_file() or not item.keeps(f"{item.remote}/requirements.txt"):
        return False
    layout = transport.layout(node)
    digest = "sha256:" + hashlib.sha256(local.read_bytes()).hexdigest()
    wheelhouse = f"{layout.env}/wheelhouse" if config.setup.wheelhouse else None
    command = user_requirements_command(
        layout, f"{item.remote}/requirements.txt", digest, wheelhouse
    )
    result = transport.run(node, command, timeout=INSTALL_TIMEOUT_S)
    if not result.ok:
        raise RemoteError(
            f"{node}: installing the working folder's requirements.txt failed: {result.tail(3)}"
        )
    installed = f"{FACT}requirements installed" in result.stdout
    if installed:
        on_event(node, "installed the working folder's requirements.txt")
    return installed
