"""The node side: ``python -m infra.storage.uploader upload|restore ...``.

``upload`` mirrors one job's run folder into its ``gs://`` folder while
the job runs, with the node's own credentials (on GCE the metadata
server). It is started beside the chief (or a sweep trial) as a task of
its own (``infra/bucket/commands.py``: detached, pid file with its start
tick), outside the TensorFlow tasks' process groups and namespaces, and:

* every ``--interval`` seconds uploads each new or changed checkpoint
  file once it has stopped changing (size and mtime equal on two looks),
  the ``checkpoint`` index after the files it names: a checkpoint is in
  the bucket within 30 s of being written;
* once the task it watches has ended (its pid file no longer names a
  live process started at that tick and carrying its TFCLUSTER_TASK and
  the TFCLUSTER_RUN_ID it had at the uploader's start),
  uploads everything else, deletes what it uploaded and the run deleted
  since (old checkpoints), writes ``tfcluster-run.json`` (what ran, how it
  ended) and exits: nothing of it is left running, nothing idles on a
  node that costs money.

A file that fails to upload (after the client's retries of each request
and whole-file attempts on top) is warned about once in the uploader's
log and tried again at the next pass; the job is never held up by it. Its
state is ``--status`` (JSON, written atomically), which ``down``,
``stop`` and the job's end read: uploaded, pending, failed, done.

``restore`` brings a run folder's checkpoints from the bucket to the node
(``train --resume`` on a new cluster); ``data`` copies a data folder of
the bucket into the node's cache once, before the job's tasks start
(``train --data-dir gs://...``). Imports only the standard
library, google-cloud-storage and this package's node-safe modules.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import signal
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from infra.storage import transfer
from infra.storage.urls import GsUrl, parse_gs_url

RUN_RECORD = "tfcluster-run.json"
# Seconds the last pass may take once the watched task has ended, retries
# included: an uploader whose bucket stays out of reach gives up and ends
# (what is left stays on the node, and its state says what).
FINAL_DEADLINE_S = 900.0
CHECKPOINTS = "checkpoints"
# A checkpoint index names the files of its checkpoints: uploaded last.
INDEX = "checkpoint"


def _task_environ(pid_file: Path) -> list[bytes] | None:
    """The environment of the task of ``pid_file`` ("PID TICK", as
    infra/node/commands.py writes it) while it runs: that pid, started at that
    tick (field 22 of /proc/PID/stat), not a zombie, with
    TFCLUSTER_TASK=<its name>; None once it does not."""
    name = pid_file.name.removesuffix(".pid")
    try:
        pid, tick = pid_file.read_text().split()[:2]
        stat_line = Path(f"/proc/{int(pid)}/stat").read_text()
        environ = Path(f"/proc/{int(pid)}/environ").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    fields = stat_line.rsplit(")", 1)[-1].split()
    if len(fields) < 20 or fields[19] != tick or fields[0] == "Z":
        return None
    return environ if f"TFCLUSTER_TASK={name}".encode() in environ else None


def task_run(pid_file: Path) -> bytes | None:
    """The ``TFCLUSTER_RUN_ID=...`` of the task of ``pid_file`` if it runs."""
    environ = _task_environ(pid_file) or []
    return next((e for e in environ if e.startswith(b"TFCLUSTER_RUN_ID=")), None)


def task_alive(pid_file: Path, run: bytes | None = None) -> bool:
    """Whether the task of ``pid_file`` still runs (and, given ``run``,
    is still of that run: the next job's chief has the same name, and
    takes its pid file over)."""
    environ = _task_environ(pid_file)
    return environ is not None and (run is None or run in environ)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """``data`` into ``path`` atomically (a reader sees the old or the new)."""
    fd, tmp = tempfile.mkstemp(prefix=".tfc-", dir=path.parent)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    os.replace(tmp, path)


@dataclass
class Mirror:
    """What one run folder has in its gs:// folder, and what is left to do."""

    run_dir: Path
    url: GsUrl
    upload: Callable[[str, Path], int]  # (object path inside url, file) -> bytes
    delete: Callable[[str], None]
    warn: Callable[[str], None]
    # path -> (size, mtime_ns) as uploaded / as last seen
    uploaded: dict[str, tuple[int, int]] = field(default_factory=dict)
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    warned: set[str] = field(default_factory=set)
    bytes: int = 0

    def files(self) -> dict[str, tuple[int, int]]:
        """Every regular file of the run folder (no symbolic link), by path.
        The run changes the folder while this looks (each TensorFlow
        checkpoint save makes and removes a ``ckpt-N_temp`` folder, old
        checkpoints go): what vanished meanwhile is not there, never an
        error (os.walk skips a folder it cannot list; pathlib's rglob
        raised)."""
        out = {}
        for folder, subfolders, names in os.walk(self.run_dir):
            subfolders.sort()
            for name in sorted(names):
                if name.startswith(".tfc-"):
                    continue
                path = Path(folder, name)
                try:
                    st = path.lstat()
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode):
                    out[path.relative_to(self.run_dir).as_posix()] = (st.st_size, st.st_mtime_ns)
        return out

    def pass_(self, *, final: bool) -> None:
        """One look: upload what changed (checkpoints only, once stable,
        unless ``final``: then everything), and at the end delete what
        was uploaded and is gone here."""
        now = self.files()
        for gone in set(self.failed) - set(now):  # the run let it go: nothing to upload
            del self.failed[gone]
        todo = [
            p
            for p, sig in now.items()
            if self.uploaded.get(p) != sig
            and (final or (p.startswith(CHECKPOINTS + "/") and self.seen.get(p) == sig))
        ]
        # A checkpoint's index after its files, and only once none of them
        # waits: the bucket never names a checkpoint it does not hold.
        todo.sort(key=lambda p: (p.rsplit("/", 1)[-1] == INDEX, p))
        for path in todo:
            if path.rsplit("/", 1)[-1] == INDEX and self._waiting(now, path):
                continue
            self._one(path, now[path])
        if final:
            for path in sorted(set(self.uploaded) - set(now)):
                try:
                    self.delete(path)
                    del self.uploaded[path]
                except Exception as exc:  # a leftover costs little; said, not fatal
                    self.warn(f"could not delete {self.url.child(path)}: {_short(exc)}")
        self.seen = now

    def _waiting(self, now: dict[str, tuple[int, int]], index: str) -> bool:
        """Whether a file beside the checkpoint index ``index`` is not in
        the bucket as it is now."""
        folder = index.rsplit("/", 1)[0] + "/"
        return any(
            p.startswith(folder) and p != index and self.uploaded.get(p) != sig
            for p, sig in now.items()
        )

    def _one(self, path: str, sig: tuple[int, int]) -> None:
        try:
            self.bytes += self.upload(path, self.run_dir / path)
        except FileNotFoundError:
            self.failed.pop(path, None)  # the run removed it meanwhile (an old checkpoint)
            return
        except Exception as exc:
            self.failed[path] = _short(exc)
            if path not in self.warned:  # once per file, however often it fails
                self.warned.add(path)
                self.warn(f"could not upload {path} to {self.url}: {_short(exc)}")
            return
        self.uploaded[path] = sig
        self.failed.pop(path, None)

    def status(self, done: bool) -> dict[str, Any]:
        pending = sorted(p for p, sig in self.files().items() if self.uploaded.get(p) != sig)
        return {
            "url": str(self.url),
            "uploaded": len(self.uploaded),
            "bytes": self.bytes,
            "pending": pending[:50],
            "pending_count": len(pending),
            "failed": dict(sorted(self.failed.items())[:20]),
            "done": done,
        }


def _short(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:200]


def _exit_code(exit_file: Path | None) -> int | None:
    try:
        return int(exit_file.read_text().strip()) if exit_file else None
    except (OSError, ValueError):
        return None


def run_upload(args: argparse.Namespace) -> int:
    url = parse_gs_url(args.url)
    client = transfer.make_client(args.endpoint, args.credentials)
    bucket = client.bucket(url.bucket)
    status_file = Path(args.status)
    watch = Path(args.watch)
    exit_file = Path(args.exit_file) if args.exit_file else None
    record: dict[str, Any] = json.loads(args.record) if args.record else {}

    def upload(path: str, local: Path) -> int:
        return transfer.upload_file(bucket, f"{url.prefix}{path}", local)

    def delete(path: str) -> None:
        bucket.blob(f"{url.prefix}{path}").delete(retry=transfer._retry())

    def warn(line: str) -> None:
        print(f"warning: {line}", flush=True)

    mirror = Mirror(Path(args.run_dir), url, upload, delete, warn)
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        if stopping:  # a second one: out now
            raise SystemExit(143)
        stopping = True  # the final pass, then out

    signal.signal(signal.SIGTERM, on_term)
    # The watched task is its run's: a relaunch of that run (a recovery)
    # is still watched, another job's task of the same name is not.
    run = task_run(watch)
    write_json(status_file, mirror.status(done=False))
    put_record(bucket, url, {**record, "status": "running"}, warn)
    while not stopping and task_alive(watch, run):
        mirror.pass_(final=False)
        write_json(status_file, mirror.status(done=False))
        _sleep_while(lambda: not stopping and task_alive(watch, run), args.interval)
    code = _exit_code(exit_file)
    signal.signal(signal.SIGALRM, _give_up)
    signal.alarm(int(FINAL_DEADLINE_S))  # the last pass is bounded, retries and all
    try:
        mirror.pass_(final=True)
        if mirror.failed:  # one more try for what failed: the network may be back
            mirror.pass_(final=True)
        _finish(bucket, url, mirror, record, code, warn)
    except _GiveUp:
        warn(f"gave up after {FINAL_DEADLINE_S:.0f} s: {url} is out of reach")
    signal.alarm(0)
    write_json(status_file, mirror.status(done=True))
    print(f"uploaded {len(mirror.uploaded)} file(s) to {url}", flush=True)
    return 0


class _GiveUp(BaseException):
    """The last pass ran out of time (a BaseException: no handler of a
    failed upload may take it for one)."""


def _give_up(signum: int, frame: Any) -> None:
    raise _GiveUp


def _finish(
    bucket: Any,
    url: GsUrl,
    mirror: Mirror,
    record: dict[str, Any],
    code: int | None,
    warn: Callable[[str], None],
) -> None:
    """The run's record, as it ended."""
    ended = {
        "status": "done" if code == 0 else "failed" if code is not None else "stopped",
        "exit_code": code,
        "finished_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": len(mirror.uploaded),
        "bytes": sum(s for s, _ in mirror.uploaded.values()),
    }
    put_record(bucket, url, {**record, **ended}, warn)


def put_record(
    bucket: Any, url: GsUrl, record: dict[str, Any], warn: Callable[[str], None]
) -> None:
    """The run's ``tfcluster-run.json`` (what `deploy.py runs` lists)."""
    try:
        blob = bucket.blob(f"{url.prefix}{RUN_RECORD}")
        blob.upload_from_string(
            json.dumps(record, sort_keys=True), content_type="application/json",
            retry=transfer._retry(),
        )  # fmt: skip
    except Exception as exc:
        warn(f"could not write {url.child(RUN_RECORD)}: {_short(exc)}")


def _sleep_while(condition: Callable[[], bool], seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end and condition():
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))


def run_restore(args: argparse.Namespace) -> int:
    """The run's checkpoints from the bucket into DIR (what is there stays)."""
    url = parse_gs_url(args.url)
    client = transfer.make_client(args.endpoint, args.credentials)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    got = transfer.download_folder(
        client,
        url,
        dest,
        only=lambda p: p.startswith(CHECKPOINTS + "/"),
        on_unsafe=lambda name: print(f"warning: skipped {name!r}: not a path in the run folder"),
    )
    print(f"@tfcluster restored {len(got)}", flush=True)
    return 0


def run_data(args: argparse.Namespace) -> int:
    """A data folder of the bucket into the node's cache, once (again
    only when an object changed: the generations of what was copied are
    kept beside it). Two copies on one node take turns (a lock): one
    copies, the other finds it there."""
    url = parse_gs_url(args.url)
    dest = Path(args.dest)
    dest.mkdir(parents=True, exist_ok=True)
    with open(dest / ".tfcluster-lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        client = transfer.make_client(args.endpoint, args.credentials)
        unsafe: list[str] = []
        objects = transfer.list_folder(client, url, on_unsafe=unsafe.append)
        if unsafe:
            print(f"error: {url}: object {unsafe[0][:120]!r} leaves the folder", file=sys.stderr)
            return 2
        if not objects:
            print(f"error: {url} holds no file", file=sys.stderr)
            return 2
        marker = dest / ".tfcluster-source.json"
        wanted = {"url": str(url), "objects": {o.path: o.generation for o in objects}}
        try:
            have = json.loads(marker.read_text())
        except (OSError, ValueError):
            have = None
        if have != wanted:
            transfer.download_folder(client, url, dest)
            write_json(marker, wanted)
            print(f"copied {len(objects)} file(s) of {url} to {dest}", flush=True)
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m infra.storage.uploader")
    parser.add_argument("--endpoint", default=None)
    parser.add_argument("--credentials", default="adc")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("upload")
    up.add_argument("--run-dir", required=True)
    up.add_argument("--url", required=True)
    up.add_argument("--watch", required=True, help="the pid file of the task to outlive")
    up.add_argument("--exit-file", default=None)
    up.add_argument("--status", required=True)
    up.add_argument("--record", default=None, help="JSON: what ran (tfcluster-run.json)")
    up.add_argument("--interval", type=float, default=5.0)
    restore = sub.add_parser("restore")
    restore.add_argument("--url", required=True)
    restore.add_argument("--dest", required=True)
    data = sub.add_parser("data", help="a data folder of the bucket into the node's cache")
    data.add_argument("--url", required=True)
    data.add_argument("--dest", required=True)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        if args.command == "upload":
            return run_upload(args)
        if args.command == "data":
            return run_data(args)
        return run_restore(args)
    except Exception as exc:
        # What the launch or the job's end says of it: one line, never a
        # traceback (unusable credentials on the node, a bucket out of reach).
        line = transfer.error_line(exc)
        if args.command == "upload":  # its state says why it did not start
            write_json(Path(args.status), {"url": args.url, "error": line, "done": True})
        print(f"error: {line}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
