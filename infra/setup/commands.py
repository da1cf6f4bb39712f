"""Shell commands that install and sync a node: what ``up`` and ``train`` run there.

Pure functions from a ``NodeLayout`` (and an install plan or sync items) to
bash text, as ``infra/node/commands.py`` is for a job's tasks; what they print
(``@tfcluster KEY VALUE`` fact lines, file listings, rsync's itemized
changes) is parsed in ``infra/setup/facts.py``. Paths in manifests and
archives are relative to the login's home (``_base``), or to ``/`` for an
absolute ``setup.remote_dir``.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from infra.node.commands import path as rpath
from infra.setup.install_plan import InstallPlan
from infra.transport.base import NodeLayout


class SyncTarget(Protocol):
    """What the commands read of a sync item (``infra/setup/sync.py``'s
    ``SyncItem``, which builds on these commands): where it goes, and
    whether a filter picks its files (a working folder)."""

    @property
    def remote(self) -> str: ...

    @property
    def filter(self) -> object | None: ...


MARKER = ".tfcluster-install"  # in the venv folder: goes when the venv goes
# What starts every line the commands print for their parsers.
FACT = "@tfcluster "
# Never synced, never deleted on the node (Python writes its own there).
EXCLUDES = ("__pycache__", "*.pyc", ".DS_Store")
# rsync's line per item: what changed, its size, its name (``parse_rsync``).
RSYNC_FORMAT = "%i %l %n"


def _marker(layout: NodeLayout) -> str:
    return f"{layout.venv}/{MARKER}"


def _shared_env(layout: NodeLayout) -> list[str]:
    """Lines that make a change to the node environment (the venv) its
    only change at a time on the login: where several clusters share it
    (provider ssh: ``<setup.remote_dir>/venv``), two `up`s at once would
    install into one venv together. A lock on the node (flock, held until
    the script ends), and an install that another cluster's is not
    replaced (exit 22): a cluster of its own install needs a
    ``setup.remote_dir`` of its own."""
    env = rpath(layout.env)
    return [
        f"mkdir -p {env}",
        f"exec 9>>{env}/.tfcluster-env.lock",
        # Bounded: a daemon that a setup.command left running keeps fd 9.
        "if command -v flock >/dev/null 2>&1 && ! flock -w 900 9; then "
        f"echo 'another install in {layout.env} did not end within 15 minutes' >&2; exit 23; fi",
    ]


def _not_another_install(layout: NodeLayout, plan: InstallPlan) -> list[str]:
    """Refuse (exit 22) to replace a venv of another install while other
    clusters share it: their jobs would run on this one's packages."""
    if layout.shared is None:
        return []
    marker = rpath(_marker(layout))
    own = shlex.quote(posixpath.basename(layout.root))
    return [
        f'm="$(cat {marker} 2>/dev/null)"',
        f'if [ -n "$m" ] && [ "$m" != {shlex.quote(plan.fingerprint)} ]; then',
        f"  for d in {rpath(layout.shared)}/*-{'[0-9a-f]' * 12}/; do",
        f'    n="${{d%/}}"; n="${{n##*/}}"; [ -d "$d" ] && [ "$n" != {own} ] || continue',
        f'    echo "{layout.venv} holds another install, which the cluster in '
        f'{layout.shared}/$n shares; give this cluster its own setup.remote_dir" >&2; exit 22',
        "  done",
        "fi",
    ]


def probe_command(
    layout: NodeLayout,
    fingerprint: str,
    items: Sequence[SyncTarget] = (),
    also: str | None = None,
) -> str:
    """Make the node's folders; report whether the install is current (its
    marker is ``fingerprint``, or ``also``: the plan with the image's own
    TensorFlow),
    which tools the node has, and (the quick check) size and mtime of every
    synced file there. Prints ``@tfcluster KEY VALUE`` lines, then the
    listing as ``SIZE MTIME PATH`` lines."""
    marker = rpath(_marker(layout))
    lines = [
        'export H="$PWD"',
        f"mkdir -p {rpath(layout.root)} {rpath(layout.code)} "
        + " ".join(rpath(i.remote) for i in items if i.filter is not None),
        f'm="$(cat {marker} 2>/dev/null)"',
        f'if [ -x {rpath(layout.python)} ] && {{ [ "$m" = {shlex.quote(fingerprint)} ]'
        + (f' || [ "$m" = {shlex.quote(also)} ]' if also else "")
        + f"; }}; then echo '{FACT}installed yes'; "
        f"else echo '{FACT}installed no'; fi",
        f"for t in rsync sha256sum tar sudo apt-get; do "
        f'if command -v "$t" >/dev/null 2>&1; then echo "{FACT}tool $t yes"; '
        f'else echo "{FACT}tool $t no"; fi; done',
    ]
    if items:
        targets = " ".join(shlex.quote(rel_to_base(i.remote)) for i in items)
        # GNU find; elsewhere the listing is just empty and the sync proper
        # decides (rsync's own quick check, or the hash manifest).
        lines += [
            f"echo '{FACT}section files'",
            f"(cd {_base(layout)} && find {targets} -name __pycache__ -prune -o -type f "
            "! -name '*.pyc' -printf '%s %T@ %p\\n' 2>/dev/null) || true",
        ]
    return "\n".join(lines)


def install_command(layout: NodeLayout, plan: InstallPlan, wheelhouse: str | None) -> str:
    """The whole install as one bash script (``set -e``): python3-venv if
    missing, the venv, pip, setup.commands, the marker last. Prints
    ``@tfcluster`` fact lines (see ``parse_install``)."""
    vpy = rpath(layout.python)
    py = shlex.quote(plan.python)
    lines = [
        "set -euo pipefail",
        'export H="$PWD"',
        f'say() {{ echo "{FACT}$*"; }}',
        f"mkdir -p {rpath(layout.root)}",
        *_shared_env(layout),
        *_not_another_install(layout, plan),
        # A half-done install must never look done: the marker goes first.
        f"rm -f {rpath(_marker(layout))}",
        f"if ! command -v {py} >/dev/null 2>&1; then",
        f"  echo {shlex.quote(f'no {plan.python} on this node (setup.python)')} >&2; exit 20",
        "fi",
        *_venv_lines(plan, py, rpath(layout.venv), vpy),
        *_pip_lines(layout, plan, vpy, wheelhouse),
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


def _pip_lines(
    layout: NodeLayout, plan: InstallPlan, vpy: str, wheelhouse: str | None
) -> list[str]:
    """Write the requirements and constraints on the node and install them
    into the venv (from the uploaded wheelhouse, if any)."""
    reqs = rpath(f"{layout.env}/requirements.txt")
    cons = rpath(f"{layout.env}/constraints.txt")
    requirements = shlex.quote(plan.requirements.rstrip("\n"))
    pip = f"{vpy} -m pip --disable-pip-version-check"
    source = f"--no-index --find-links {rpath(wheelhouse)}" if wheelhouse else ""
    # The package that must not sit beside the one we install: both ship
    # the same `tensorflow` module.
    other = "tensorflow-cpu" if plan.gpu else "tensorflow"
    return [
        # One quoted word, not a heredoc: a requirements line equal to the
        # heredoc's delimiter would end it and run the rest as commands.
        f"printf '%s\\n' {requirements} > {reqs}",
        f"printf '%s\\n' {shlex.quote(plan.constraints.rstrip(chr(10)))} > {cons}",
        # (importlib.metadata answers in milliseconds; `pip show` takes a second)
        *(
            []
            if plan.system_tf
            else [
                f"if {vpy} -c 'import importlib.metadata as m; m.version(\"{other}\")' "
                f">/dev/null 2>&1; then {pip} uninstall -q -y {other}; fi"
            ]
        ),
        f"{pip} install -q {source} -r {reqs} -c {cons}".replace("  ", " "),
        *_no_deps_lines(layout, plan, pip, source),
        "say pip installed",
    ]


def _no_deps_lines(layout: NodeLayout, plan: InstallPlan, pip: str, source: str) -> list[str]:
    """The plan's requirements that go in without their dependencies
    (tf-keras: its metadata asks for the `tensorflow` wheel, whose module
    the venv already has from tensorflow-cpu or tensorflow[and-cuda])."""
    if not plan.no_deps:
        return []
    file = rpath(f"{layout.root}/requirements-no-deps.txt")
    return [
        f"printf '%s\\n' {shlex.quote(plan.no_deps.rstrip(chr(10)))} > {file}",
        f"{pip} install -q --no-deps {source} -r {file}".replace("  ", " "),
    ]


def _venv_lines(plan: InstallPlan, py: str, venv: str, vpy: str) -> list[str]:
    """Make the venv unless it is there: with python3-venv from apt first
    where the node's Python lacks ensurepip (a fresh Debian VM)."""
    # The image's own TensorFlow: the venv must see the system site-packages
    # (an older venv made without them is made again).
    system = " --system-site-packages" if plan.system_tf else ""
    stale = (
        [
            f"if ! grep -qs '^include-system-site-packages = true' {venv}/pyvenv.cfg; "
            f"then rm -rf {venv}; fi"
        ]
        if plan.system_tf
        else []
    )
    return [
        *stale,
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
        f"    {py} -m venv{system} --without-pip {venv} && "
        f'{vpy} "$w/pip" install -q --no-index --no-compile "$w"',
        "  else",
        f"    {py} -m venv{system} {venv}",
        "  fi",
        "  say venv created",
        "fi",
    ]


def user_requirements_command(
    layout: NodeLayout, requirements: str, digest: str, wheelhouse: str | None
) -> str:
    """Install the working folder's requirements.txt into the node's venv,
    unless that very content was installed last (its hash is kept in the
    venv folder: a new venv installs again). Prints ``@tfcluster requirements
    installed`` or ``... current``."""
    marker = rpath(f"{layout.venv}/.tfcluster-user-requirements")
    links = f" --find-links {rpath(wheelhouse)}" if wheelhouse else ""
    return "\n".join(
        [
            'export H="$PWD"',
            *_shared_env(layout),
            f'if [ "$(cat {marker} 2>/dev/null)" = {shlex.quote(digest)} ]; then',
            f"  echo '{FACT}requirements current'; exit 0",
            "fi",
            f"{rpath(layout.python)} -m pip --disable-pip-version-check install -q{links} "
            f"-r {rpath(requirements)} || exit $?",
            f"echo {shlex.quote(digest)} > {marker}",
            f"echo '{FACT}requirements installed'",
        ]
    )


def rsync_args(
    sources: Sequence[Path], dest: str, *, contents: bool, hidden: Sequence[str] = ()
) -> list[str]:
    """rsync flags for ``sources`` into the node folder ``dest``. With
    ``contents`` the one source folder's *contents* go into ``dest``.
    ``hidden`` (paths from the transfer's root, ``/a/key``; or a name,
    ``.ssh/``, anywhere) are never sent, and deleted on the node should an
    earlier sync have sent them: a hide rule (``H``) is the sender's alone,
    so it protects nothing there."""
    args = ["-a", "-z", "--delete", f"--out-format={RSYNC_FORMAT}"]
    args += [f"--filter=H {rsync_pattern(path)}" for path in hidden]
    args += [f"--exclude={pattern}" for pattern in EXCLUDES]
    # "--": a source path that starts with "-" is a path, never an option.
    args.append("--")
    if contents:
        args.append(f"{sources[0]}/")
    else:
        args += [str(s) for s in sources]
    return args


def rsync_pattern(path: str) -> str:
    """``path`` as an rsync pattern that matches it alone (anchored when it
    starts with ``/``): rsync reads ``*``, ``?`` and ``[`` as wildcards, and
    a backslash as an escape only in a pattern that has one of them."""
    if any(c in path for c in "*?["):
        return "".join("\\" + c if c in "\\*?[" else c for c in path)
    return path


def _base(layout: NodeLayout) -> str:
    """The folder paths in manifests and archives are relative to."""
    return "/" if layout.root.startswith("/") else '"$H"'


def rel_to_base(remote: str) -> str:
    """A remote path as manifests, archives and stale lists name it (from ``_base``)."""
    return remote.lstrip("/")


def compare_command(layout: NodeLayout, manifest_file: str, items: Sequence[SyncTarget]) -> str:
    """On the node: which manifest entries differ or are missing, and which
    files exist under the synced paths (to find the stale ones)."""
    targets = " ".join(shlex.quote(rel_to_base(i.remote)) for i in items)
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


def apply_command(
    layout: NodeLayout, archive: str | None, stale_list: str | None, dirs_list: str | None = None
) -> str:
    """Delete the stale files and the folders that leaves empty, then
    unpack the archive of changed files. In that order: a file that became
    a folder here (or a folder a file) cannot be unpacked over the old one."""
    lines = ['export H="$PWD"', "set -e"]
    if stale_list:
        lines += [
            f"(cd {_base(layout)} && xargs -0 -r rm -f -- < {rpath(stale_list)})",
            f"rm -f {rpath(stale_list)}",
        ]
    if dirs_list:
        # Deepest first; one still holding files (a node's own, in ignored
        # places) stays, and is no reason to stop.
        lines += [
            f"(cd {_base(layout)} && xargs -0 -r rmdir --ignore-fail-on-non-empty -- "
            f"< {rpath(dirs_list)}) 2>/dev/null || true",
            f"rm -f {rpath(dirs_list)}",
        ]
    if archive:
        lines += [
            f"tar -xzf {rpath(archive)} -C {_base(layout)}",
            f"rm -f {rpath(archive)}",
        ]
    lines.append(f"echo '{FACT}applied'")
    return "\n".join(lines)


# -- the code a job started with (infra/setup/code_snapshot.py) ------------------------------

CODE_FILE = ".tfcluster-code"
# `SIZE MTIME ./PATH` of the synced files (from _base), sorted bytewise.
_CODE_LISTING = (
    "-name __pycache__ -prune -o -type f ! -name '*.pyc' -printf '%s %T@ %p\\n' 2>/dev/null"
)
# The same for each file xargs names (sh -c's "$@").
_CODE_FIND = 'find "$@" -maxdepth 0 ' + _CODE_LISTING


def record_code_command(layout: NodeLayout, run_id: str, remotes: Sequence[str]) -> str:
    """Write what the job's code is on this node as it starts: the run id,
    then size, mtime and path of every file under ``remotes`` (the synced
    paths). Prints ``@tfcluster code recorded N``."""
    f = rpath(f"{layout.root}/{CODE_FILE}")
    targets = " ".join(shlex.quote("./" + rel_to_base(r)) for r in remotes)
    return "\n".join(
        [
            'export H="$PWD"',
            f"{{ echo {shlex.quote(run_id)}; (cd {_base(layout)} && "
            f"find {targets} {_CODE_LISTING}) | LC_ALL=C sort; }} > {f}.tmp",
            f"mv -f {f}.tmp {f}",
            f'echo "{FACT}code recorded $(($(wc -l < {f}) - 1))"',
        ]
    )


def check_code_command(layout: NodeLayout, run_id: str) -> str:
    """Whether the files recorded when ``run_id`` started are unchanged:
    prints ``@tfcluster code unknown`` (no record of that job),
    ``@tfcluster code changed N`` and up to three ``@tfcluster code-file
    PATH`` of the files changed or gone. Files added since do not count
    (a program's own outputs)."""
    f = rpath(f"{layout.root}/{CODE_FILE}")
    return "\n".join(
        [
            'export H="$PWD"',
            f'if [ "$(head -n 1 {f} 2>/dev/null)" != {shlex.quote(run_id)} ]; then '
            f"echo '{FACT}code unknown'; exit 0; fi",
            f"tail -n +2 {f} > {f}.was",
            # The recorded paths (any bytes but a line break: the sync sends
            # no other) as find's starting points, through "$@".
            f"(cd {_base(layout)} && cut -d ' ' -f 3- < {f}.was | xargs -r -d '\\n' sh -c "
            f"{shlex.quote(_CODE_FIND)} find) "
            f"| LC_ALL=C sort > {f}.now",
            f"LC_ALL=C comm -23 {f}.was {f}.now > {f}.diff",
            f'echo "{FACT}code changed $(wc -l < {f}.diff)"',
            f"head -n 3 {f}.diff | cut -d ' ' -f 3- | sed 's|^|{FACT}code-file |'",
            f"rm -f {f}.was {f}.now {f}.diff",
        ]
    )
