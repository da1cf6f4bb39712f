"""The local, per-cluster state folder: a cache, never the truth.

``$TFCLUSTER_HOME/clusters/<name>/`` (default ``~/.tfcluster``) holds the
cluster's SSH key (mode 0600), its pinned host keys, its id, the last known
node addresses and the last job. The provider's own view (GCE labels, the
hosts list, the process table) always wins: losing this folder loses the
SSH key, which ``up`` re-creates and re-installs, and the id
(``cluster_id``), which tells the cluster's nodes and folders from those
of another cluster of the same name (another person's): without it they
are another's, refused by ``up``, until the id is put back.

Several tfcluster processes may touch one state file at once (a ``status``
while a ``train`` follows its job). Every read-modify-write holds a short
lock of its own (``state.lock``, apart from the command lock in
``infra/state/lock.py``, so that read-only commands never wait for a long
``up``), and every write is atomic: a temp file in the same folder,
fsync'ed, then renamed over the old one. A state file that cannot be
trusted (not a file, not UTF-8 JSON, not an object, a broken last job) is
set aside once, with one warning, and the cluster starts from an empty
cache that the provider's view fills in again; its id, when sound, is kept
(nothing could fill it in again).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import secrets
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from infra.state.lock import open_lock_file

log = logging.getLogger("tfcluster")

# The state's key for the cluster's id (``ClusterState.cluster_id``): 12 hex
# digits, a valid GCE label value and a plain folder name.
CLUSTER_ID = "cluster_id"
# Whether the state is older than its id (an older tfcluster's: it had
# nodes, a job or its key when the id was made): only such a state takes
# the cluster's nodes and rules that carry no id as its own.
ADOPTS = "adopts_unmarked"
_ID = re.compile(r"^[0-9a-f]{12}\Z")


def tfcluster_home() -> Path:
    return Path(os.environ.get("TFCLUSTER_HOME") or Path.home() / ".tfcluster")


class ClusterState:
    """Files of one cluster under ``tfcluster_home()/clusters/<name>``."""

    def __init__(self, name: str, home: Path | None = None) -> None:
        self.name = name
        self.dir = (home or tfcluster_home()) / "clusters" / name
        self._id: str | None = None

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
    def lock_file(self) -> Path:
        """The command lock (``infra/state/lock.py``): who changes the cluster now."""
        return self.dir / "cluster.lock"

    def ensure_dir(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        if stat.S_IMODE(self.dir.stat().st_mode) != 0o700:
            # Keys and host keys live here: nobody else may list or read it.
            os.chmod(self.dir, 0o700)
        return self.dir

    def load(self) -> dict[str, Any]:
        """The cached state ({} when there is none or it was set aside)."""
        if not os.path.lexists(self.file):
            return {}
        with self._locked():
            return self._read()

    def update(self, **values: Any) -> dict[str, Any]:
        """Merge ``values`` into state.json (under the state lock, atomically)."""
        return self.modify(lambda data: data.update(values))

    def modify(self, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Read, ``change`` in place, write back: no other process's update
        in between is lost, and a crash leaves the old file whole."""
        with self._locked():
            data = self._read()
            change(data)
            self._write(data)
            return data

    def get(self, key: str, default: Any = None) -> Any:
        return self.load().get(key, default)

    def cluster_id(self) -> str:
        """What makes this cluster its own where names are shared: random,
        made once (under the state lock: two commands at once agree) and
        kept here. Nodes another state made under the same name (a
        colleague's, in one GCE project) carry another; on an SSH login
        shared by several clusters each has its own folder by it."""
        if self._id is None:  # read once: it never changes once made
            found = self.get(CLUSTER_ID)
            if not (isinstance(found, str) and _ID.match(found)):
                data = self.modify(self._make_id)
                found = str(data[CLUSTER_ID])
            self._id = found
        return self._id

    def _make_id(self, data: dict[str, Any]) -> None:
        if CLUSTER_ID in data:  # another command made it meanwhile
            return
        data[ADOPTS] = bool(data.get("nodes") or data.get("last_job") or self.key_file.exists())
        data[CLUSTER_ID] = secrets.token_hex(6)

    def adopts_unmarked(self) -> bool:
        """Whether nodes and rules of the cluster's name that carry no id
        (made by a tfcluster without ids) are this state's: only where the
        state is older than its id. A new state (another person's, who kept
        the name) never takes them: its `up` would replace their ssh-keys."""
        self.cluster_id()
        # No word either way: an id made before this key existed, by a
        # tfcluster that took them all.
        return self.get(ADOPTS) is not False

    # -- the file ------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The short state lock: held for one read-modify-write, never for a
        command (each call opens the file anew, so threads exclude each other too)."""
        self.ensure_dir()
        fd = open_lock_file(self.dir / "state.lock")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _read(self) -> dict[str, Any]:
        """The state file's object; an untrustworthy file is set aside
        (call with the state lock held, so only one process does it)."""
        try:
            info = os.lstat(self.file)
        except FileNotFoundError:
            return {}
        if not stat.S_ISREG(info.st_mode):
            # A folder, a link, a fifo (which would block a plain read): not ours.
            return self._set_aside("not a regular file")
        try:
            text = self.file.read_bytes().decode("utf-8")
            data = json.loads(text)
        except UnicodeDecodeError:
            return self._set_aside("not UTF-8 text")
        except json.JSONDecodeError as exc:
            return self._set_aside(f"not JSON: {exc.msg} at line {exc.lineno}")
        except RecursionError:  # json.loads of [[[[... thousands deep
            return self._set_aside("nested too deep")
        except OSError as exc:
            return self._set_aside(f"unreadable: {exc.strerror}")
        if not isinstance(data, dict):
            return self._set_aside(f"a JSON {type(data).__name__}, not an object")
        problem = _check(data)
        if problem:
            aside = self._set_aside(problem)
            found = data.get(CLUSTER_ID)
            if isinstance(found, str) and _ID.match(found):
                # The id is what makes the cluster's nodes and folders its
                # own: it is kept, not rebuilt (nothing could rebuild it).
                aside = {CLUSTER_ID: found, **({ADOPTS: data[ADOPTS]} if ADOPTS in data else {})}
                self._write(aside)
            return aside
        return data

    def _write(self, data: dict[str, Any]) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.dir, prefix=".state-", suffix=".json")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(data, out, indent=2, sort_keys=True)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def _set_aside(self, why: str) -> dict[str, Any]:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = self.file.with_name(f"{self.file.name}.corrupt-{stamp}")
        n = 0
        while os.path.lexists(target):
            n += 1
            target = self.file.with_name(f"{self.file.name}.corrupt-{stamp}-{n}")
        os.rename(self.file, target)
        log.warning(
            "%s was %s; set aside as %s (the provider's view rebuilds the state)",
            self.file,
            why,
            target.name,
        )
        return {}


def _check(data: dict[str, Any]) -> str | None:
    """What is wrong with a parsed state object (None: nothing we read)."""
    found = data.get(CLUSTER_ID)
    if found is not None and not (isinstance(found, str) and _ID.match(found)):
        return "holding a broken cluster id"
    from infra.spec.job import JobRecord  # it imports the trainer catalog; state is imported by all

    last = data.get("last_job")
    if last is not None:
        try:
            JobRecord.from_dict(last)
        except ValueError as exc:
            return f"holding a broken last job ({exc})"
    nodes = data.get("nodes")
    if nodes is not None and not isinstance(nodes, dict):
        return "holding a broken node list"
    return None
