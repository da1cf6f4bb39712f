"""The runs of a cluster in its bucket, from this machine: what ``deploy.py
runs`` lists, and a run folder brought home (``fetch`` after ``down``,
``report``/``tensorboard`` of a run in the bucket).

A run is the folder ``<prefix>/<cluster>/<run id>/``; what ran and how it
ended is its ``tfcluster-run.json``, written by the node's uploader (a run
whose record is missing or unreadable is still listed, by its id and
size). Object names are the bucket's data: a run folder is fetched only
when every name in it is a plain path inside it, and nothing is written
before that is known.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.errors import StateError, UnsafeRemoteEntry
from infra.storage import transfer
from infra.storage.uploader import RUN_RECORD
from infra.storage.urls import GsUrl, run_id_problem

if TYPE_CHECKING:
    from google.cloud.storage.client import Client

    from infra.config.schema import FetchLimits


@dataclass(frozen=True)
class BucketRun:
    """One run folder in the bucket."""

    run_id: str
    url: str
    started_at: str
    label: str
    model: str | None
    mode: str | None
    status: str
    exit_code: int | None
    size: int
    files: int

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _within(where: str, objects: list[transfer.Listed], limits: FetchLimits) -> None:
    """FetchLimitExceeded naming the first object past ``limits``, known
    from the listing before anything is written."""
    from infra.transport.fetch import too_big, too_many

    total = 0
    for count, obj in enumerate(objects, 1):
        total += obj.size
        if count > limits.max_entries:
            raise too_many(where, obj.path, limits)
        if total > limits.max_bytes:
            raise too_big(where, obj.path, limits)


def _record(client: Client, url: GsUrl) -> dict[str, Any]:
    blob = client.bucket(url.bucket).blob(url.prefix + RUN_RECORD)
    try:
        data = json.loads(blob.download_as_bytes(retry=transfer._retry()))
    except Exception:  # missing or torn: the run is listed without it
        return {}
    return data if isinstance(data, dict) else {}


def _text(value: Any, limit: int = 200) -> str:
    return value[:limit] if isinstance(value, str) else ""


def list_runs(client: Client, cluster_url: GsUrl) -> list[BucketRun]:
    """Every run folder under ``cluster_url``, oldest first."""
    runs = []
    for run_id in transfer.subfolders(client, cluster_url):
        if run_id_problem(run_id) is not None:
            continue  # not a folder tfcluster wrote
        url = cluster_url.child(run_id)
        objects = transfer.list_folder(client, url)
        record = _record(client, url)
        code = record.get("exit_code")
        runs.append(
            BucketRun(
                run_id=run_id,
                url=str(url),
                started_at=_text(record.get("started_at")),
                label=_text(record.get("label")),
                model=_text(record.get("model"), 40) or None,
                mode=_text(record.get("mode"), 40) or None,
                status=_text(record.get("status")) or "unknown",
                exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
                size=sum(o.size for o in objects),
                files=len(objects),
            )
        )
    return sorted(runs, key=lambda r: (r.started_at or r.run_id, r.run_id))


def fetch_run(client: Client, url: GsUrl, dest: Path, limits: FetchLimits | None = None) -> int:
    """The run folder ``url`` into ``dest``; the number of files. Refused
    (UnsafeRemoteEntry, nothing written) when an object's name is not a
    plain path in the folder; StateError when the folder is empty;
    FetchLimitExceeded (nothing written) past ``limits`` (cluster.yaml's
    ``fetch``: the nodes wrote what is in the bucket, and are held to the
    same limits there as when they are fetched from directly)."""
    unsafe: list[str] = []
    objects = transfer.list_folder(client, url, on_unsafe=unsafe.append)
    if unsafe:
        raise UnsafeRemoteEntry(
            f"{url}: refused object {unsafe[0][:120]!r}: its name leaves the run folder; "
            "nothing was fetched"
        )
    if not objects:
        raise StateError(f"{url} holds no run: nothing to fetch")
    if limits is not None:
        _within(str(url), objects, limits)
    dest.mkdir(parents=True, exist_ok=True)
    transfer.download_folder(client, url, dest)
    return len(objects)
