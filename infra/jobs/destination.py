"""Where a job's results come home, checked before anything starts.

A job's run folder (``train``, ``run``), a sweep's folder and ``fetch``
land in ``--dest`` (default runs/<cluster>/ of the current folder). A
destination that cannot be written used to be found only at the end, after
the whole job had run: a warning, exit 0, the results left on the chief's
node. It is bad input, so it is refused first, as a ConfigError naming it.
One that goes bad while the job runs is still ``Job.fetch``'s one line (a
warning after a job, exit 7 for ``fetch``).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from infra.errors import ConfigError


def check_destination(
    folder: Path, given: Path | str, *, key: str = "--dest", hint: str | None = None
) -> None:
    """A ConfigError ('--dest GIVEN: why; what to do') unless ``folder`` is
    a folder this process can write in, or its nearest existing parent is
    (the folders between are made by the fetch). ``given`` is the value
    as the user wrote it (``folder`` may be a run folder inside it)."""
    try:
        for path in (folder, *folder.parents):
            if path.is_dir():
                problem = _cannot_write_in(path)
                break
            if os.path.lexists(path):
                # A link that leads nowhere (or round in a loop) is broken; one
                # to a file is a file in the way, as the file itself would be.
                broken = path.is_symlink() and not path.exists()
                kind = "a broken symbolic link" if broken else "a file, not a folder"
                problem = f"{path} is {kind}"
                break
        else:  # pragma: no cover - "/" or "." ends every walk up
            problem = None
    except OSError as exc:  # a parent that cannot even be looked into
        problem = exc.strerror or str(exc)
    if problem is not None:
        raise ConfigError(f"{key} {given}: {problem}; give a folder you can write", hint=hint)


def _cannot_write_in(folder: Path) -> str | None:
    """Why no folder can be made in ``folder``; None when one can. Asked
    by making (and removing) one: os.access says yes to root everywhere
    but on a read-only mount, yet the kernel refuses a folder in /proc."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".tfcluster-dest-", dir=folder))
    except OSError as exc:
        return f"cannot write in {folder}: {exc.strerror or exc}"
    return None
