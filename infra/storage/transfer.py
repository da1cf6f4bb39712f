"""Moving files between a folder and a bucket with Google's client:
opening a client with given credentials and endpoint, uploading one file
(resumable above the client's multipart limit, every request retried on
the transient answers: 429, 5xx, a dropped connection), listing a folder,
downloading a folder with every object name checked before anything is
written.

Used on both sides: by the node's uploader (infra/storage/uploader.py) and by
this machine's ``fetch``, ``runs``, ``report`` (infra/bucket/runs.py).
Standard library, google-cloud-storage and ``urls`` only: the nodes run it.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infra.storage._gcs import storage, storage_retry
from infra.storage.urls import GsUrl, relative_name

if TYPE_CHECKING:
    from google.cloud.storage.bucket import Bucket
    from google.cloud.storage.client import Client

STORAGE_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
# Uploads above the client's multipart limit (8 MiB) go in resumable chunks
# of this size (a multiple of 256 KiB, as the protocol requires): a chunk
# that fails is sent again from where the bucket says it stopped.
CHUNK_BYTES = 8 * 1024 * 1024
# Seconds one request may take before it counts as failed (and is retried).
REQUEST_TIMEOUT_S = 120.0
# Whole-file attempts on top of the client's own retries of each request.
ATTEMPTS = 3


def make_client(endpoint: str | None, credentials: str, base: Path | None = None) -> Client:
    """A Cloud Storage client. ``credentials``: "adc" (application default:
    on a GCE node its metadata server), "anonymous" (an emulator), or a
    service-account key file (relative to ``base``). ``endpoint`` None:
    Google's."""
    from google.auth.credentials import AnonymousCredentials

    project: str | None = None
    creds: Any
    if credentials == "anonymous":
        creds = AnonymousCredentials()
    elif credentials == "adc":
        import google.auth

        creds, project = google.auth.default(scopes=[STORAGE_SCOPE])
    else:
        from google.oauth2 import service_account

        path = Path(credentials).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        creds = service_account.Credentials.from_service_account_file(
            str(path), scopes=[STORAGE_SCOPE]
        )
        project = creds.project_id
    options = {"api_endpoint": endpoint} if endpoint else None
    return storage.Client(project=project, credentials=creds, client_options=options)


def root_cause(exc: BaseException) -> BaseException:
    """The error at the bottom of ``exc``'s chain: the client's RetryError
    wraps requests' ConnectionError, which wraps urllib3's, which wraps
    the socket's "[Errno 111] Connection refused", which says it best."""
    seen: set[int] = set()
    while id(exc) not in seen:
        seen.add(id(exc))
        below = (
            getattr(exc, "cause", None)  # RetryError's last error
            or exc.__cause__
            or exc.__context__
            or getattr(exc, "reason", None)  # urllib3's
        )
        if not isinstance(below, BaseException):
            break
        exc = below
    return exc


def error_line(exc: BaseException) -> str:
    """``exc`` in one short line: its root cause's type and first line."""
    root = root_cause(exc)
    lines = str(root).strip().splitlines()
    return f"{type(root).__name__}: {lines[0] if lines else ''}".rstrip(": ")[:300]


def account_of(client: Client, credentials: str) -> str:
    """Who the client is, for a message: a service account's email, else
    what the credentials are."""
    creds = client._credentials
    email = getattr(creds, "service_account_email", None)
    if isinstance(email, str) and "@" in email:
        return email
    if credentials == "anonymous":
        return "anonymous (no credentials)"
    if credentials == "adc":
        return "your application-default credentials"
    return f"the key in {credentials}"


def _retry() -> Any:
    # Every upload is retried on transient answers, also without a
    # generation precondition: the uploader writes each object whole, and
    # a repeat writes the same bytes again.
    return storage_retry.DEFAULT_RETRY.with_timeout(REQUEST_TIMEOUT_S)


def upload_file(
    bucket: Bucket,
    name: str,
    path: Path,
    *,
    chunk_bytes: int = CHUNK_BYTES,
    attempts: int = ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
) -> int:
    """Upload ``path`` as object ``name``; its size. Raises the last error
    once ``attempts`` whole tries have failed."""
    for attempt in range(1, attempts + 1):
        blob = bucket.blob(name, chunk_size=chunk_bytes)
        try:
            blob.upload_from_filename(
                str(path), retry=_retry(), timeout=REQUEST_TIMEOUT_S, checksum="auto"
            )
            return path.stat().st_size
        except FileNotFoundError:
            raise  # gone (the run removed it): trying again finds nothing
        except Exception:
            if attempt == attempts:
                raise
            sleep(min(30.0, 2.0**attempt))
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class Listed:
    """An object of a folder: its path inside the folder, size, generation."""

    path: str
    size: int
    generation: int
    updated: str | None


def is_folder_marker(name: str, size: int | None) -> bool:
    """Whether object ``name`` only marks a folder: empty, its name ending
    in '/'. The Cloud console's "Create folder" makes one, and so does
    TensorFlow's ``tf.io.gfile.makedirs`` on gs:// (for each level it
    makes); they hold nothing, and name no file."""
    return name.endswith("/") and not size


def list_folder(
    client: Client, url: GsUrl, *, on_unsafe: Callable[[str], None] | None = None
) -> list[Listed]:
    """Every object under ``url`` (all pages), by its path there. An object
    whose name is not a plain path inside the folder (``../x``, ``a//b``)
    is left out, and ``on_unsafe(name)`` told of it; a folder marker
    (``is_folder_marker``) is left out silently."""
    out = []
    for blob in client.list_blobs(url.bucket, prefix=url.prefix, retry=_retry()):
        if is_folder_marker(blob.name, blob.size):
            continue  # a folder, which the files in it make here: nothing to write
        rel = relative_name(blob.name, url.prefix)
        if rel is None:
            if on_unsafe is not None:
                on_unsafe(blob.name)
            continue
        updated = blob.updated.isoformat() if blob.updated is not None else None
        out.append(Listed(rel, int(blob.size or 0), int(blob.generation or 0), updated))
    return out


def subfolders(client: Client, url: GsUrl) -> Iterator[str]:
    """The names of the folders directly under ``url`` (delimiter '/')."""
    pages = client.list_blobs(url.bucket, prefix=url.prefix, delimiter="/", retry=_retry())
    for page in pages.pages:
        for prefix in page.prefixes:
            name = prefix[len(url.prefix) :].rstrip("/")
            if name and "/" not in name:
                yield name


def download_folder(
    client: Client,
    url: GsUrl,
    dest: Path,
    *,
    only: Callable[[str], bool] = lambda path: True,
    on_unsafe: Callable[[str], None] | None = None,
) -> list[Listed]:
    """Download every object under ``url`` (whose path ``only`` keeps)
    into ``dest``; the objects written. Names are checked before the
    first byte is written (see ``list_folder``); each file is written to a
    temporary name in its folder and renamed, so a file is whole or absent."""
    objects = [o for o in list_folder(client, url, on_unsafe=on_unsafe) if only(o.path)]
    bucket = client.bucket(url.bucket)
    root = dest.resolve()
    for obj in objects:
        target = root.joinpath(*obj.path.split("/"))
        target.parent.mkdir(parents=True, exist_ok=True)
        # relative_name refused '..' and absolute names; a symbolic link
        # already in the destination must not lead out of it either.
        parent = target.parent.resolve()
        if (parent != root and root not in parent.parents) or target.is_symlink():
            raise OSError(f"{target} would be written outside {root} (a symbolic link)")
        download_file(bucket, url.prefix + obj.path, target, generation=obj.generation)
    return objects


def download_file(
    bucket: Bucket, name: str, target: Path, *, generation: int | None = None
) -> None:
    """One object into ``target`` (whole or not at all)."""
    fd, tmp = tempfile.mkstemp(prefix=".tfc-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            blob = bucket.blob(name, generation=generation or None)
            blob.download_to_file(out, retry=_retry(), timeout=REQUEST_TIMEOUT_S)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
