"""Install and sync: what ``up`` does on every node once it runs.

**Install** (idempotent): a virtualenv at ``layout.python``'s venv with the
pinned trainer requirements, python3-venv first if the image lacks it (a
fresh Debian VM does: ``sudo apt-get``), then ``setup.commands``. What was
installed is summed up in one fingerprint (``InstallPlan.fingerprint``: the
requirements text, the Python, the wheelhouse listing, the commands and the
GPU flag) that the install writes last, to ``<root>/venv/.tfcluster-install``;
a later ``up`` whose fingerprint matches installs nothing. The node image's
``BAKE_VENV=1`` build writes the same marker (``python -m infra.setup
marker``), so fresh containers start with nothing to install.

With ``setup.wheelhouse`` (a local folder of wheels) the folder is copied to
``<root>/wheelhouse`` (incrementally) and pip installs with ``--no-index``:
nodes need no PyPI. With ``gce.accelerator`` (provider gce) the node gets
``tensorflow[and-cuda]`` of the pinned version instead of tensorflow-cpu.
pip brings CUDA and cuDNN as wheels, but the NVIDIA *driver* must come with
the machine: use a GPU image that has it (Deep Learning VM images such as
``projects/deeplearning-platform-release/global/images/family/common-cu124-debian-11``
install it on first boot), or install it on Debian 12 with
``setup.commands: ["sudo apt-get install -y linux-headers-cloud-amd64 nvidia-driver"]``
(non-free components enabled). The install reports a node with no working
``nvidia-smi`` as a warning.

**Sync** (incremental): ``trainer/`` and ``pyproject.toml`` of this checkout
go to ``layout.code``; each ``setup.sync`` path (relative to the config
file's folder; ``$VAR``, ``${VAR}`` and ``${VAR:-default}`` are expanded
from the environment) goes to ``<root>/<its basename>``, so a data folder
``mnist`` is ``tfcluster/mnist`` on the nodes (``job.data_dir``). Only
changed files move: rsync over the cluster's SSH (its key, its pinned host
keys) when both ends have rsync; else a manifest of SHA-256 hashes is
checked on the node (``sha256sum -c``) and a tar of what differs is sent.
Files gone locally are deleted on the node; ``__pycache__`` is left alone.

Commands are pure functions of a ``NodeLayout`` and a plan; what they print
(``@tfcluster`` fact lines, rsync's itemized changes) is parsed by separate
functions, tested on recorded output in ``tests/recorded/``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from infra.commands import path as rpath
from infra.config import ClusterConfig
from infra.errors import ConfigError, RemoteError, StateError
from infra.remote import SshTransport, combine_errors
from infra.transport import NodeLayout, Transport

log = logging.getLogger("tfcluster")

# The checkout whose trainer/ the nodes run.
PROJECT_ROOT = Path(__file__).resolve().parents[1]
# What of the checkout goes to layout.code.
CODE_PATHS = ("trainer", "pyproject.toml")
# Never synced, never deleted on the node (Python writes its own there).
EXCLUDES = ("__pycache__", "*.pyc", ".DS_Store")
# Basenames under <root> that tfcluster itself uses: a synced folder of the
# same name would overwrite them.
RESERVED = ("code", "venv", "runs", "logs", "wheelhouse", "requirements.txt")

MARKER = ".tfcluster-install"  # in the venv folder: goes when the venv goes
MARKER_VERSION = "1"  # bump when the meaning of the fingerprint changes
FACT = "@tfcluster "
# A first install of TensorFlow from PyPI on a small VM takes minutes.
INSTALL_TIMEOUT_S = 1800.0
SYNC_TIMEOUT_S = 1800.0

OnEvent = Callable[[str, str], None]


# -- what to install ----------------------------------------------------------------


@dataclass(frozen=True)
class InstallPlan:
    """Everything that decides what a node's venv holds."""

    requirements: str  # the requirements text installed (GPU swap applied)
    python: str  # the interpreter that makes the venv (setup.python)
    wheels: tuple[tuple[str, int], ...] | None  # wheelhouse listing (name, size); None = PyPI
    commands: tuple[str, ...]  # setup.commands, run after pip
    gpu: bool  # tensorflow[and-cuda] instead of tensorflow-cpu
    wheelhouse: Path | None = field(default=None, compare=False)  # the local folder

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
        blob = json.dumps(data, sort_keys=True, separators=(",", ":")).encode()
        return "sha256:" + hashlib.sha256(blob).hexdigest()


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


def install_plan(config: ClusterConfig) -> InstallPlan:
    text = requirements_file(config).read_text()
    gpu = config.provider == "gce" and config.gce.accelerator is not None
    wheelhouse = None
    wheels = None
    if config.setup.wheelhouse:
        wheelhouse = config.resolve(expand_vars(config.setup.wheelhouse, "setup.wheelhouse"))
        if not wheelhouse.is_dir():
            raise ConfigError(
                f"setup.wheelhouse: {wheelhouse} is not a folder; make one with "
                "docker/build-wheelhouse.sh DIR (pip download of the requirements)"
            )
        wheels = wheelhouse_listing(wheelhouse)
        if not wheels:
            raise ConfigError(f"setup.wheelhouse: {wheelhouse} holds no .whl files")
    return InstallPlan(
        requirements=gpu_requirements(text) if gpu else text,
        python=config.setup.python,
        wheels=wheels,
        commands=tuple(config.setup.commands),
        gpu=gpu,
        wheelhouse=wheelhouse,
    )


# -- what to sync ---------------------------------------------------------------------


@dataclass(frozen=True)
class SyncItem:
    """A local file or folder and where it goes on a node."""

    local: Path
    remote: str  # a layout-style path: relative to the login's home, or absolute


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
    ``<root>/<basename>``."""
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
        items.append(SyncItem(local, f"{layout.root}/{name}"))
    return items


def synced_path(config: ClusterConfig, layout: NodeLayout, entry: str) -> str:
    """Where the setup.sync ``entry`` lives on a node (for job.data_dir)."""
    local = config.resolve(expand_vars(entry, "setup.sync"))
    return f"{layout.root}/{local.name}"


# -- commands and their facts -------------------------------------------------------


def _marker(layout: NodeLayout) -> str:
    return f"{layout.root}/venv/{MARKER}"


def probe_command(layout: NodeLayout, fingerprint: str, items: Sequence[SyncItem] = ()) -> str:
    """Make the node's folders; report whether the install is current,
    which tools the node has, and (the quick check) size and mtime of every
    synced file there. Prints ``@tfcluster KEY VALUE`` lines, then the
    listing as ``SIZE MTIME PATH`` lines."""
    marker = rpath(_marker(layout))
    lines = [
        'export H="$PWD"',
        f"mkdir -p {rpath(layout.root)} {rpath(layout.code)}",
        f'if [ -x {rpath(layout.python)} ] && [ "$(cat {marker} 2>/dev/null)" = '
        f"{shlex.quote(fingerprint)} ]; then echo '{FACT}installed yes'; "
        f"else echo '{FACT}installed no'; fi",
        f"for t in rsync sha256sum tar sudo apt-get; do "
        f'if command -v "$t" >/dev/null 2>&1; then echo "{FACT}tool $t yes"; '
        f'else echo "{FACT}tool $t no"; fi; done',
    ]
    if items:
        targets = " ".join(shlex.quote(_rel(i.remote)) for i in items)
        # GNU find; elsewhere the listing is just empty and the sync proper
        # decides (rsync's own quick check, or the hash manifest).
        lines += [
            f"echo '{FACT}section files'",
            f"(cd {_base(layout)} && find {targets} -name __pycache__ -prune -o -type f "
            "! -name '*.pyc' -printf '%s %T@ %p\\n' 2>/dev/null) || true",
        ]
    return "\n".join(lines)


def parse_listing(stdout: str, layout: NodeLayout) -> dict[str, tuple[int, int]] | None:
    """The probe's file listing: remote path -> (size, mtime in ms); None
    when the node printed no listing section at all."""
    absolute = layout.root.startswith("/")
    listing: dict[str, tuple[int, int]] = {}
    inside = False
    for line in stdout.splitlines():
        if line.startswith(FACT):
            inside = line == FACT + "section files"
            continue
        if not inside:
            continue
        size, mtime, path = [*line.split(" ", 2), "", ""][:3]
        if not size.isdigit() or not path:
            continue
        try:
            millis = int(float(mtime) * 1000)
        except ValueError:
            continue
        listing[("/" + path.lstrip("/")) if absolute else path] = (int(size), millis)
    return listing if inside or listing else None


def local_listing(items: Sequence[SyncItem]) -> dict[str, tuple[int, int]]:
    """What ``parse_listing`` should read once the node is in sync: rsync -a
    and the tar fallback (PAX headers) both keep mtimes below the second, so
    size + mtime is rsync's own quick check, done without starting rsync."""
    out: dict[str, tuple[int, int]] = {}
    for item in items:
        files = [item.local] if item.local.is_file() else sorted(_walk(item.local))
        for file in files:
            rel = file.relative_to(item.local).as_posix() if file != item.local else ""
            st = file.stat()
            millis = st.st_mtime_ns // 1_000_000
            out[f"{item.remote}/{rel}" if rel else item.remote] = (st.st_size, millis)
    return out


def _under(listing: Mapping[str, tuple[int, int]], prefix: str) -> dict[str, tuple[int, int]]:
    """The part of a listing at or below the remote path ``prefix``."""
    return {k: v for k, v in listing.items() if k == prefix or k.startswith(prefix + "/")}


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
class Probe:
    installed: bool
    tools: dict[str, bool]

    @property
    def rsync(self) -> bool:
        return self.tools.get("rsync", False)

    @property
    def sha256sum(self) -> bool:
        return self.tools.get("sha256sum", False)


def _facts(stdout: str) -> Iterable[list[str]]:
    for line in stdout.splitlines():
        if line.startswith(FACT):
            yield line[len(FACT) :].split()


def parse_probe(stdout: str) -> Probe:
    installed = False
    tools: dict[str, bool] = {}
    for words in _facts(stdout):
        if words[:1] == ["installed"] and len(words) == 2:
            installed = words[1] == "yes"
        elif words[:1] == ["tool"] and len(words) == 3:
            tools[words[1]] = words[2] == "yes"
    return Probe(installed=installed, tools=tools)


def install_command(layout: NodeLayout, plan: InstallPlan, wheelhouse: str | None) -> str:
    """The whole install as one bash script (``set -e``): python3-venv if
    missing, the venv, pip, setup.commands, the marker last. Prints
    ``@tfcluster`` fact lines (see ``parse_install``)."""
    root = rpath(layout.root)
    venv = rpath(f"{layout.root}/venv")
    vpy = rpath(layout.python)
    reqs = rpath(f"{layout.root}/requirements.txt")
    py = shlex.quote(plan.python)
    pip = f"{vpy} -m pip --disable-pip-version-check"
    source = f"--no-index --find-links {rpath(wheelhouse)}" if wheelhouse else ""
    # The package that must not sit beside the one we install: both ship
    # the same `tensorflow` module.
    other = "tensorflow-cpu" if plan.gpu else "tensorflow"
    lines = [
        "set -euo pipefail",
        'export H="$PWD"',
        f'say() {{ echo "{FACT}$*"; }}',
        f"mkdir -p {root}",
        # A half-done install must never look done: the marker goes first.
        f"rm -f {rpath(_marker(layout))}",
        f"if ! command -v {py} >/dev/null 2>&1; then",
        f"  echo 'no {plan.python} on this node (setup.python)' >&2; exit 20",
        "fi",
        f"if [ ! -x {vpy} ]; then",
        # Debian's python3 lacks ensurepip until python3-venv is installed.
        f"  if ! {py} -c 'import ensurepip, venv' >/dev/null 2>&1; then",
        "    say apt python3-venv",
        '    if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo -n"; fi',
        # python3-venv, and pythonX.Y-venv for a setup.python like python3.11.
        f"    v=$({py} -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])')",
        '    pkgs="python3-venv python$v-venv"',
        "    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq",
        "    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "-o Dpkg::Options::=--force-confold $pkgs >/dev/null",
        "  fi",
        f"  rm -rf {venv}",
        # Debian's pip wheel, run from the zip, puts pip in a bare venv in
        # half the time ensurepip takes (which also installs setuptools,
        # not needed for wheels); ensurepip where that wheel is missing.
        "  w=$(ls /usr/share/python-wheels/pip-*.whl 2>/dev/null | tail -n 1)",
        '  if [ -n "$w" ]; then',
        # --no-compile: pip's own modules compile as they are first imported.
        f"    {py} -m venv --without-pip {venv} && "
        f'{vpy} "$w/pip" install -q --no-index --no-compile "$w"',
        "  else",
        f"    {py} -m venv {venv}",
        "  fi",
        "  say venv created",
        "fi",
        f"cat > {reqs} <<'TFCLUSTER_REQUIREMENTS'",
        plan.requirements.rstrip("\n"),
        "TFCLUSTER_REQUIREMENTS",
        # (importlib.metadata answers in milliseconds; `pip show` takes a second)
        f"if {vpy} -c 'import importlib.metadata as m; m.version(\"{other}\")' "
        f">/dev/null 2>&1; then {pip} uninstall -q -y {other}; fi",
        f"{pip} install -q {source} -r {reqs}".replace("  ", " "),
        "say pip installed",
    ]
    for index, command in enumerate(plan.commands, 1):
        # Each in its own bash from the home folder: a `cd` in one does not
        # move the next, and a failure stops the install (and is reported).
        lines += [
            f'(cd "$H" && bash -e -c {shlex.quote(command)}) || '
            f'{{ echo "setup.commands[{index - 1}] failed: exit $?" >&2; exit 21; }}',
            f"say command {index}",
        ]
    if plan.gpu:
        lines.append(
            "if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; "
            "then say gpu yes; else say gpu no; fi"
        )
    lines += [
        f"echo {shlex.quote(plan.fingerprint)} > {rpath(_marker(layout))}",
        "say done",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class InstallFacts:
    done: bool
    apt: bool  # python3-venv had to be installed
    venv_created: bool
    commands_run: int
    gpu: bool | None  # None: not a GPU install


def parse_install(stdout: str) -> InstallFacts:
    done = apt = venv = False
    commands_run = 0
    gpu: bool | None = None
    for words in _facts(stdout):
        match words:
            case ["done"]:
                done = True
            case ["apt", *_]:
                apt = True
            case ["venv", "created"]:
                venv = True
            case ["command", n] if n.isdigit():
                commands_run = max(commands_run, int(n))
            case ["gpu", answer]:
                gpu = answer == "yes"
            case _:
                pass
    return InstallFacts(done, apt, venv, commands_run, gpu)


@dataclass(frozen=True)
class SyncStats:
    files: int = 0  # files sent (new or changed)
    bytes: int = 0  # their total size
    deleted: int = 0  # files removed on the node (gone locally)

    def __add__(self, other: SyncStats) -> SyncStats:
        return SyncStats(
            self.files + other.files, self.bytes + other.bytes, self.deleted + other.deleted
        )


RSYNC_FORMAT = "%i %l %n"


def rsync_args(sources: Sequence[Path], dest: str, *, contents: bool) -> list[str]:
    """rsync flags for ``sources`` into the node folder ``dest``. With
    ``contents`` the one source folder's *contents* go into ``dest``."""
    args = ["-a", "-z", "--delete", f"--out-format={RSYNC_FORMAT}"]
    args += [f"--exclude={pattern}" for pattern in EXCLUDES]
    if contents:
        args.append(f"{sources[0]}/")
    else:
        args += [str(s) for s in sources]
    return args


def parse_rsync(stdout: str) -> SyncStats:
    """rsync ``--out-format='%i %l %n'`` lines: ``<f`` items were sent to
    the node (``>f``: received, when pulling); ``*deleting`` ones removed."""
    files = size = deleted = 0
    for line in stdout.splitlines():
        if line.startswith("*deleting"):
            if not line.rstrip().endswith("/"):
                deleted += 1
            continue
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[0][:2] in ("<f", ">f") and parts[1].isdigit():
            files += 1
            size += int(parts[1])
    return SyncStats(files, size, deleted)


@dataclass(frozen=True)
class LocalFile:
    path: Path
    sha256: str
    size: int
    mtime: float


def local_manifest(items: Sequence[SyncItem]) -> dict[str, LocalFile]:
    """Remote path -> the local file that belongs there, with its hash."""
    out: dict[str, LocalFile] = {}
    for item in items:
        files = [item.local] if item.local.is_file() else sorted(_walk(item.local))
        for file in files:
            rel = file.relative_to(item.local).as_posix() if file != item.local else ""
            remote = f"{item.remote}/{rel}" if rel else item.remote
            out[remote] = _hashed(file)
    return out


def _walk(folder: Path) -> Iterable[Path]:
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not _excluded(d)]
        for name in filenames:
            if not _excluded(name):
                yield Path(dirpath) / name


def _excluded(name: str) -> bool:
    return name == "__pycache__" or name.endswith(".pyc") or name == ".DS_Store"


def _hashed(file: Path) -> LocalFile:
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    st = file.stat()
    return LocalFile(file, digest.hexdigest(), st.st_size, st.st_mtime)


def manifest_text(manifest: Mapping[str, LocalFile]) -> str:
    """``sha256sum -c`` input: ``HASH  PATH`` per file."""
    return "".join(f"{f.sha256}  {remote}\n" for remote, f in sorted(manifest.items()))


def _base(layout: NodeLayout) -> str:
    """The folder paths in manifests and archives are relative to."""
    return "/" if layout.root.startswith("/") else '"$H"'


def _rel(remote: str) -> str:
    return remote.lstrip("/")


def compare_command(layout: NodeLayout, manifest_file: str, items: Sequence[SyncItem]) -> str:
    """On the node: which manifest entries differ or are missing, and which
    files exist under the synced paths (to find the stale ones)."""
    targets = " ".join(shlex.quote(_rel(i.remote)) for i in items)
    return "\n".join(
        [
            'export H="$PWD"',
            f"cd {_base(layout)}",
            f"echo '{FACT}section changed'",
            f"sha256sum -c --quiet {rpath(manifest_file)} 2>/dev/null | "
            "sed -n 's/: FAILED.*$//p' || true",
            f"echo '{FACT}section present'",
            f"find {targets} -name __pycache__ -prune -o -type f ! -name '*.pyc' -print "
            "2>/dev/null || true",
            f"rm -f {rpath(manifest_file)}",
        ]
    )


@dataclass(frozen=True)
class Comparison:
    changed: set[str]  # remote paths (as in the manifest) to send
    present: set[str]  # remote paths that exist on the node


def parse_compare(stdout: str, layout: NodeLayout) -> Comparison:
    absolute = layout.root.startswith("/")
    section = ""
    changed: set[str] = set()
    present: set[str] = set()
    for line in stdout.splitlines():
        if line.startswith(FACT + "section "):
            section = line.split()[-1]
            continue
        if not line:
            continue
        path = ("/" + line.lstrip("/")) if absolute else line
        if section == "changed":
            changed.add(path)
        elif section == "present":
            present.add(path)
    return Comparison(changed, present)


def apply_command(layout: NodeLayout, archive: str | None, stale_list: str | None) -> str:
    """Unpack the archive of changed files, delete the stale ones."""
    lines = ['export H="$PWD"', "set -e"]
    if archive:
        lines += [
            f"tar -xzf {rpath(archive)} -C {_base(layout)}",
            f"rm -f {rpath(archive)}",
        ]
    if stale_list:
        lines += [
            f"(cd {_base(layout)} && xargs -0 -r rm -f -- < {rpath(stale_list)})",
            f"rm -f {rpath(stale_list)}",
        ]
    lines.append(f"echo '{FACT}applied'")
    return "\n".join(lines)


def build_archive(manifest: Mapping[str, LocalFile], paths: Iterable[str], out: IO[bytes]) -> int:
    """A tar.gz of the local files for ``paths`` (remote paths; names in the
    archive are relative to ``_base``); returns their total size."""
    total = 0
    with tarfile.open(fileobj=out, mode="w:gz", compresslevel=1) as tar:
        for remote in sorted(paths):
            local = manifest[remote]
            info = tar.gettarinfo(str(local.path), arcname=_rel(remote))
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            with open(local.path, "rb") as handle:
                tar.addfile(info, handle)
            total += local.size
    return total


# -- the report -------------------------------------------------------------------------


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
    seconds: float = 0.0
    error: str | None = None
    warnings: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.install == "installed" or bool(self.files or self.deleted)

    def line(self) -> str:
        if self.error:
            return f"{self.node}: FAILED: {self.error}"
        parts = []
        if self.install == "installed":
            parts.append(f"installed ({self.install_seconds:.0f} s)")
        elif self.install == "already installed":
            parts.append("already installed")
        if self.files or self.deleted:
            what = f"synced {self.files} file{'s' * (self.files != 1)} ({_size(self.bytes)})"
            if self.deleted:
                what += f", deleted {self.deleted}"
            parts.append(f"{what} via {self.method}")
        else:
            parts.append("code up to date")
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


# -- doing it ---------------------------------------------------------------------------


def _ssh(transport: Transport) -> SshTransport:
    if not isinstance(transport, SshTransport):
        raise StateError(
            f"install and sync need SSH nodes; {type(transport).__name__} nodes run this "
            "checkout directly"
        )
    return transport


def sync_to_node(
    transport: SshTransport,
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
        for dest, sources, whole in _rsync_groups(items, contents):
            target = transport.rsync_remote(node, dest + ("/" if not whole else ""))
            out = transport.rsync(
                node, [*rsync_args(sources, "", contents=whole), target], timeout=SYNC_TIMEOUT_S
            )
            stats = stats + parse_rsync(out)
        return stats, "rsync"
    return _manifest_sync(transport, node, items), "manifest"


def _rsync_groups(items: Sequence[SyncItem], contents: bool) -> list[tuple[str, list[Path], bool]]:
    """(remote folder, local sources, contents-mode) per rsync call: items
    whose basename is kept share one call per remote parent folder."""
    groups: dict[str, list[Path]] = {}
    single: list[tuple[str, list[Path], bool]] = []
    for item in items:
        parent, _, name = item.remote.rpartition("/")
        if contents or name != item.local.name or not parent:
            single.append((item.remote, [item.local], True))
        else:
            groups.setdefault(parent, []).append(item.local)
    return [(dest, sources, False) for dest, sources in groups.items()] + single


def _manifest_sync(transport: SshTransport, node: str, items: Sequence[SyncItem]) -> SyncStats:
    layout = transport.layout(node)
    manifest = local_manifest(items)
    manifest_file = f"{layout.root}/.tfcluster-manifest"
    transport.upload(node, manifest_text(manifest).encode(), manifest_file)
    result = transport.run(node, compare_command(layout, manifest_file, items), timeout=600)
    if not result.ok:
        raise RemoteError(f"{node}: comparing files failed: {result.tail()}")
    comparison = parse_compare(result.stdout, layout)
    send = sorted(p for p in comparison.changed if p in manifest)
    stale = sorted(comparison.present - set(manifest))
    if not send and not stale:
        return SyncStats()
    archive = stale_list = None
    size = 0
    if send:
        archive = f"{layout.root}/.tfcluster-sync.tar.gz"
        with tempfile.NamedTemporaryFile(prefix="tfcluster-sync-", suffix=".tar.gz") as tmp:
            size = build_archive(manifest, send, tmp)
            tmp.flush()
            transport.upload(node, Path(tmp.name), archive)
    if stale:
        stale_list = f"{layout.root}/.tfcluster-stale"
        transport.upload(node, b"".join(_rel(p).encode() + b"\0" for p in stale), stale_list)
    done = transport.run(node, apply_command(layout, archive, stale_list), timeout=600)
    if not done.ok:
        raise RemoteError(f"{node}: unpacking the synced files failed: {done.tail()}")
    return SyncStats(len(send), size, len(stale))


def _setup_node(
    transport: SshTransport,
    node: str,
    config: ClusterConfig,
    plan: InstallPlan | None,
    on_event: OnEvent,
) -> NodeSetup:
    started = time.monotonic()
    report = NodeSetup(node)
    layout = transport.layout(node)
    items = sync_items(config, layout)
    fingerprint = plan.fingerprint if plan else ""
    probed = transport.run(node, probe_command(layout, fingerprint, items), timeout=60)
    if not probed.ok:
        raise RemoteError(f"{node}: preparing {layout.root} failed: {probed.tail()}")
    probe = parse_probe(probed.stdout)
    use_rsync = probe.rsync and transport.has_local_rsync()
    transport.note_rsync(node, probe.rsync)
    if not use_rsync and not (probe.sha256sum and probe.tools.get("tar", False)):
        raise RemoteError(
            f"{node}: has neither rsync nor sha256sum+tar to sync files with; "
            "install rsync there (sudo apt-get install rsync)"
        )
    if plan is not None:
        if probe.installed:
            report.install = "already installed"
        else:
            install_started = time.monotonic()
            wheelhouse_remote = None
            if plan.wheelhouse is not None:
                on_event(node, f"uploading the wheelhouse ({len(plan.wheels or ())} wheels)")
                wheelhouse_remote = f"{layout.root}/wheelhouse"
                stats, _ = sync_to_node(
                    transport,
                    node,
                    [SyncItem(plan.wheelhouse, wheelhouse_remote)],
                    rsync=use_rsync,
                    contents=True,
                )
                report.wheelhouse_files = stats.files
            on_event(node, "installing the trainer's requirements (first time: minutes)")
            result = transport.run(
                node, install_command(layout, plan, wheelhouse_remote), timeout=INSTALL_TIMEOUT_S
            )
            facts = parse_install(result.stdout)
            if not result.ok or not facts.done:
                raise RemoteError(f"{node}: install failed: {result.tail(5)}")
            if facts.gpu is False:
                report.warnings.append(
                    "no working nvidia-smi: TensorFlow will not see the GPU until the "
                    "NVIDIA driver is installed (see infra/setup.py)"
                )
            report.install = "installed"
            report.install_seconds = time.monotonic() - install_started
            on_event(node, f"installed in {report.install_seconds:.0f} s")
    # The quick check: items whose files all match in size and mtime are
    # there already (the common `train` case: all of them), and cost no rsync
    # process and no second round trip.
    remote = parse_listing(probed.stdout, layout)
    local = local_listing(items)
    stale = [
        item
        for item in items
        if remote is None or not in_sync(_under(remote, item.remote), _under(local, item.remote))
    ]
    if not stale:
        report.method = "quick check"
    else:
        stats, method = sync_to_node(transport, node, stale, rsync=use_rsync)
        report.files, report.bytes, report.deleted = stats.files, stats.bytes, stats.deleted
        report.method = method
    report.seconds = time.monotonic() - started
    return report


def setup_nodes(
    transport: Transport,
    config: ClusterConfig,
    *,
    on_event: OnEvent | None = None,
    install: bool = True,
    check: bool = True,
) -> SetupReport:
    """Install (unless ``install`` is False) and sync on every node of
    ``transport``, all at once. Each node's outcome is in the report; with
    ``check`` a failure on any node raises one ``RemoteError`` naming each
    failed node (its ``report`` attribute holds the whole report)."""
    ssh = _ssh(transport)
    started = time.monotonic()
    emit: OnEvent = on_event or (lambda node, what: None)
    plan = install_plan(config) if install else None
    for node in ssh.nodes:  # config mistakes surface once, before any node work
        sync_items(config, ssh.layout(node))
    nodes = list(ssh.nodes)
    reports: dict[str, NodeSetup] = {}

    def one(node: str) -> NodeSetup:
        return _setup_node(ssh, node, config, plan, emit)

    with ThreadPoolExecutor(max_workers=max(1, min(16, len(nodes)))) as pool:
        futures = {node: pool.submit(one, node) for node in nodes}
        errors: dict[str, RemoteError] = {}
        for node, future in futures.items():
            try:
                reports[node] = future.result()
            except RemoteError as exc:
                errors[node] = exc
                reports[node] = NodeSetup(node, install="failed", error=str(exc))
    report = SetupReport(reports, time.monotonic() - started)
    if check and errors:
        combined = combine_errors(errors)
        failure = type(combined)(f"setup failed: {combined}", hint=combined.hint)
        failure.report = report  # type: ignore[attr-defined]
        raise failure
    return report


def sync_nodes(
    transport: Transport,
    config: ClusterConfig,
    *,
    on_event: OnEvent | None = None,
    check: bool = True,
) -> SetupReport:
    """Only the incremental code and data sync (``train`` does this first)."""
    return setup_nodes(transport, config, on_event=on_event, install=False, check=check)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m infra.setup marker --config FILE``: the install marker a
    node set up for that config carries (the node image's BAKE_VENV=1
    build writes it). ``plan`` prints the whole plan as JSON."""
    import argparse

    from infra.config import load_config

    parser = argparse.ArgumentParser(prog="python -m infra.setup")
    parser.add_argument("what", choices=["marker", "plan"])
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    try:
        plan = install_plan(load_config(args.config))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.what == "marker":
        print(plan.fingerprint)
    else:
        data = asdict(plan)
        data["wheelhouse"] = str(plan.wheelhouse) if plan.wheelhouse else None
        data["fingerprint"] = plan.fingerprint
        print(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
