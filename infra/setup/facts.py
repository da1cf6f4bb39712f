"""What the install and sync commands print, parsed.

The parsers of ``infra/setup/commands.py``'s output, as ``infra/node/facts.py``
is for a job's commands: the node is not trusted to print well-formed
lines, so a line that does not parse is skipped, never an exception.
Tested on recorded output in ``tests/recorded/``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from infra.node.facts import int_of
from infra.setup.commands import FACT
from infra.transport.base import NodeLayout


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
        if (bytes_ := int_of(size)) is None or not path:
            continue
        try:
            millis = int(float(mtime) * 1000)
        except (ValueError, OverflowError):  # not a number; inf, nan
            continue
        listing[("/" + path.lstrip("/")) if absolute else path] = (bytes_, millis)
    return listing if inside or listing else None


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
            case ["command", n] if int_of(n) is not None:
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
        if len(parts) == 3 and parts[0][:2] in ("<f", ">f") and int_of(parts[1]) is not None:
            files += 1
            size += int(parts[1])
    return SyncStats(files, size, deleted)


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


@dataclass(frozen=True)
class CodeCheck:
    """What ``check_code_command`` found: ``known`` (the node has a record
    of the job), how many recorded files changed or are gone, some of them."""

    known: bool
    changed: int = 0
    files: tuple[str, ...] = ()


def parse_code_check(stdout: str) -> CodeCheck:
    """A node that printed nothing we read has no record: unknown."""
    known, changed, files = False, 0, []
    for line in stdout.splitlines():
        if line.startswith(FACT + "code-file "):
            files.append(line[len(FACT + "code-file ") :].removeprefix("./"))
        elif line.startswith(FACT + "code changed ") and (
            n := int_of(line.split()[-1])
        ) is not None:
            known, changed = True, n
    return CodeCheck(known, changed, tuple(files[:3]))
