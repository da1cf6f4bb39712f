"""A fake of the Cloud Storage JSON API, for the real google-cloud-storage client.

Point the client at it with ``client_options={"api_endpoint": fake.endpoint}``
and anonymous credentials (or cluster.yaml ``storage.endpoint``). What it
serves, as the JSON API reference describes it:

* buckets: ``GET /storage/v1/b/B`` (404 ``notFound`` for a missing one),
  ``GET .../iam`` and ``.../iam/testPermissions`` (the permissions the
  caller holds, of those asked: ``FakeBucket.permissions``);
* objects: list (``prefix``, ``delimiter`` with ``prefixes``, pages of
  ``maxResults`` with ``nextPageToken``), get, delete, download
  (``alt=media``, a ``Range`` answered 206 with ``Content-Range``, and
  ``x-goog-hash``/``x-goog-generation`` as GCS sends them);
* uploads: ``uploadType=media``, ``multipart`` (multipart/related: JSON
  metadata, then the bytes) and ``resumable`` (a session URL in
  ``Location``; chunks ``PUT`` with ``Content-Range``, answered 308 with
  ``Range: bytes=0-N`` of what is persisted, a status query ``bytes */*``,
  200 with the object once whole); ``ifGenerationMatch`` on uploads and
  deletes (412 ``conditionNotMet``; 0: the object must not exist);
* a caller without ``storage.objects.create`` is refused 403, as GCS does.

Faults: ``fail(status, ...)`` answers the next matching request(s) with
an error instead (a 503 in the middle of a resumable upload: the chunk is
not persisted, the client asks where it stands and sends it again);
``cut_download(after)`` closes a download after some bytes (the client
resumes with a Range); ``slow(seconds, ...)`` answers uploads late. ``calls`` records every request.

Object bodies are kept in memory; it is a test fake.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import secrets
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import google_crc32c

# The four permissions a writer of runs needs on the bucket's objects.
OBJECT_ADMIN = frozenset(
    {"storage.objects.create", "storage.objects.delete", "storage.objects.get",
     "storage.objects.list"}
)  # fmt: skip
_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_CONTENT_RANGE = re.compile(r"^bytes (?:(\d+)-(\d+)|\*)/(\d+|\*)$")


class GcsError(Exception):
    """An error answer in the JSON API's shape."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status, self.message, self.reason = status, message, reason

    def payload(self) -> dict[str, Any]:
        return {
            "error": {
                "code": self.status,
                "message": self.message,
                "errors": [{"message": self.message, "domain": "global", "reason": self.reason}],
            }
        }


@dataclass
class StoredObject:
    name: str
    data: bytes
    generation: int
    content_type: str
    updated: str
    metadata: dict[str, str] = field(default_factory=dict)


@dataclass
class FakeBucket:
    name: str
    # What every caller may do here (testIamPermissions answers with these).
    permissions: set[str] = field(default_factory=lambda: set(OBJECT_ADMIN))
    # The bucket's IAM policy as `GET .../iam` returns it.
    bindings: list[dict[str, Any]] = field(default_factory=list)
    objects: dict[str, StoredObject] = field(default_factory=dict)


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str]
    status: int = 0
    # Who called: the service account a token of ``/token`` was issued to;
    # None without a token (anonymous).
    account: str | None = None


@dataclass
class _Fault:
    status: int  # 0: answered as usual, after ``delay``
    method: str | None
    upload: str | None  # media | multipart | resumable | chunk (a session PUT)
    name: str | None  # the object uploaded (media, multipart, resumable starts)
    after: int  # matching requests let through first
    times: int
    suffix: str | None = None  # the uploaded object's name ends so
    delay: float = 0.0  # seconds before the answer


@dataclass
class _Session:
    bucket: str
    name: str
    content_type: str
    total: int | None
    if_generation: int | None
    data: bytearray = field(default_factory=bytearray)
    done: dict[str, Any] | None = None


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _crc32c(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


def _md5(data: bytes) -> str:
    return base64.b64encode(hashlib.md5(data).digest()).decode()


class FakeGcs:
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self._host, self._port = host, port
        self._lock = threading.RLock()
        self.buckets: dict[str, FakeBucket] = {}
        self.calls: list[Call] = []
        # Object names in the order they were written.
        self.writes: list[str] = []
        self._faults: list[_Fault] = []
        self._cuts: list[int] = []
        self._sessions: dict[str, _Session] = {}
        self._tokens: dict[str, str] = {}  # access token -> account
        self._generation = 1_700_000_000_000_000
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        # The host:port the client is told (Location of a resumable
        # session); a test whose nodes reach the fake by another address
        # sets it.
        self.public_endpoint: str | None = None

    # -- lifetime -------------------------------------------------------------------

    def start(self) -> FakeGcs:
        server = ThreadingHTTPServer((self._host, self._port), _Handler)
        server.daemon_threads = True
        server.fake = self  # type: ignore[attr-defined]
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeGcs:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self.public_endpoint:
            return self.public_endpoint
        if self._server is None:
            raise RuntimeError("the fake is not started")
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    # -- the test's view ----------------------------------------------------------------

    def create_bucket(self, name: str, *, permissions: Iterable[str] = OBJECT_ADMIN) -> FakeBucket:
        with self._lock:
            bucket = FakeBucket(name, set(permissions))
            self.buckets[name] = bucket
            return bucket

    def put(self, bucket: str, name: str, data: bytes) -> None:
        with self._lock:
            self._store(bucket, name, data, "application/octet-stream", None)

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        with self._lock:
            return sorted(n for n in self.buckets[bucket].objects if n.startswith(prefix))

    def read(self, bucket: str, name: str) -> bytes:
        with self._lock:
            return self.buckets[bucket].objects[name].data

    def fail(
        self,
        status: int = 503,
        *,
        method: str | None = None,
        upload: str | None = None,
        name: str | None = None,
        after: int = 0,
        times: int = 1,
    ) -> None:
        """Answer ``status`` to the next ``times`` requests that match
        (``method``; ``upload``: media, multipart, resumable (the start of
        a session) or chunk (a PUT into one); ``name``: the object an
        upload writes), after letting ``after`` matching ones through."""
        with self._lock:
            self._faults.append(_Fault(status, method, upload, name, after, times))

    def slow(
        self,
        seconds: float,
        *,
        upload: str | None = None,
        suffix: str | None = None,
        after: int = 0,
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` uploads that match (``upload`` as in
        ``fail``; ``suffix``: how the object's name ends), after letting
        ``after`` through, only ``seconds`` late: a slow bucket (each
        request in a thread of its own: the others are not held)."""
        with self._lock:
            self._faults.append(_Fault(0, None, upload, None, after, times, suffix, seconds))

    def cut_download(self, after: int) -> None:
        """Close the next download's connection after ``after`` bytes of its body."""
        with self._lock:
            self._cuts.append(after)

    def failures_left(self) -> int:
        with self._lock:
            return sum(f.times for f in self._faults)

    # -- serving --------------------------------------------------------------------

    def _fault_for(self, method: str, upload: str | None, name: str | None) -> _Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.method not in (None, method) or fault.upload not in (None, upload):
                    continue
                if fault.name not in (None, name):
                    continue
                if fault.suffix is not None and not (name or "").endswith(fault.suffix):
                    continue
                if fault.after > 0:
                    fault.after -= 1
                    continue
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def _bucket(self, name: str) -> FakeBucket:
        bucket = self.buckets.get(name)
        if bucket is None:
            raise GcsError(404, "The specified bucket does not exist.", "notFound")
        return bucket

    def _need(self, bucket: FakeBucket, permission: str, what: str) -> None:
        if permission not in bucket.permissions:
            raise GcsError(
                403,
                f"the caller does not have {permission} access to {what}. "
                f"Permission '{permission}' denied on resource (or it may not exist).",
                "forbidden",
            )

    def _object(self, bucket: FakeBucket, name: str) -> StoredObject:
        obj = bucket.objects.get(name)
        if obj is None:
            raise GcsError(404, f"No such object: {bucket.name}/{name}", "notFound")
        return obj

    def _check_generation(self, bucket: FakeBucket, name: str, wanted: int | None) -> None:
        if wanted is None:
            return
        current = bucket.objects.get(name)
        if (current.generation if current else 0) != wanted:
            raise GcsError(
                412, "At least one of the pre-conditions you specified did not hold.",
                "conditionNotMet",
            )  # fmt: skip

    def _store(
        self, bucket_name: str, name: str, data: bytes, content_type: str, if_gen: int | None
    ) -> dict[str, Any]:
        bucket = self._bucket(bucket_name)
        self._need(bucket, "storage.objects.create", f"the Google Cloud Storage object {name}")
        if not name or len(name.encode()) > 1024 or "\r" in name or "\n" in name:
            raise GcsError(400, "The specified object name is not valid.", "invalid")
        self._check_generation(bucket, name, if_gen)
        self._generation += 1
        obj = StoredObject(name, bytes(data), self._generation, content_type, _now())
        bucket.objects[name] = obj
        self.writes.append(name)
        return self._resource(bucket_name, obj)

    def _resource(self, bucket: str, obj: StoredObject) -> dict[str, Any]:
        link = f"{self.endpoint}/storage/v1/b/{bucket}/o/{quote(obj.name, safe='')}"
        return {
            "kind": "storage#object",
            "id": f"{bucket}/{obj.name}/{obj.generation}",
            "selfLink": link,
            "mediaLink": f"{self.endpoint}/download/storage/v1/b/{bucket}/o/"
            f"{quote(obj.name, safe='')}?generation={obj.generation}&alt=media",
            "name": obj.name,
            "bucket": bucket,
            "generation": str(obj.generation),
            "metageneration": "1",
            "contentType": obj.content_type,
            "storageClass": "STANDARD",
            "size": str(len(obj.data)),
            "md5Hash": _md5(obj.data),
            "crc32c": _crc32c(obj.data),
            "etag": base64.b64encode(str(obj.generation).encode()).decode(),
            "timeCreated": obj.updated,
            "updated": obj.updated,
        }

    def handle(self, req: _Handler) -> None:
        parts = urlsplit(req.path)
        segments = [unquote(s) for s in parts.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        call = Call(req.command, parts.path, query)
        bearer = (req.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        with self._lock:
            self.calls.append(call)
            call.account = self._tokens.get(bearer)
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        if req.command == "POST" and segments == ["token"]:
            return self._token(req, body, call)
        upload = name = None
        if segments[:1] == ["upload"]:
            upload = "chunk" if req.command == "PUT" else query.get("uploadType")
            name = _upload_name(upload, query, req.headers.get("Content-Type") or "", body)
        try:
            fault = self._fault_for(req.command, upload, name)
            if fault is not None:
                time.sleep(fault.delay)
                if fault.status:
                    raise GcsError(fault.status, "We encountered an internal error. Please try "
                                   "again.", "backendError")  # fmt: skip
            with self._lock:
                self._route(req, segments, query, body, call)
        except GcsError as exc:
            call.status = exc.status
            _send_json(req, exc.status, exc.payload())

    def _token(self, req: _Handler, body: bytes, call: Call) -> None:
        """OAuth's token endpoint, as a service-account key's ``token_uri``
        names it: a signed JWT assertion in, an access token out (the
        signature is not checked; the account is the assertion's ``iss``)."""
        form = {k: v[-1] for k, v in parse_qs(body.decode()).items()}
        try:
            claims = json.loads(base64.urlsafe_b64decode(form["assertion"].split(".")[1] + "=="))
            account = str(claims["iss"])
        except (KeyError, IndexError, ValueError):
            call.status = 400
            return _send_json(req, 400, {"error": "invalid_grant"})
        token = secrets.token_urlsafe(16)
        with self._lock:
            self._tokens[token] = account
        call.status = 200
        return _send_json(req, 200, {"access_token": token, "token_type": "Bearer",
                                     "expires_in": 3600})  # fmt: skip

    def accounts(self) -> set[str | None]:
        """Who made the storage requests so far (None: anonymous)."""
        with self._lock:
            return {c.account for c in self.calls if c.path != "/token"}

    def _route(
        self, req: _Handler, seg: list[str], query: dict[str, str], body: bytes, call: Call
    ) -> None:
        method = req.command
        if seg[:3] == ["storage", "v1", "b"] and len(seg) >= 4:
            bucket = self._bucket(seg[3])
            rest = seg[4:]
            if method == "GET" and not rest:
                call.status = 200
                return _send_json(req, 200, {"kind": "storage#bucket", "name": bucket.name,
                                             "id": bucket.name, "location": "US"})  # fmt: skip
            if method == "GET" and rest == ["iam", "testPermissions"]:
                asked = parse_qs(urlsplit(req.path).query).get("permissions", [])
                held = [p for p in asked if p in bucket.permissions]
                call.status = 200
                return _send_json(req, 200, {"kind": "storage#testIamPermissionsResponse",
                                             "permissions": held})  # fmt: skip
            if method == "GET" and rest == ["iam"]:
                self._need(bucket, "storage.buckets.getIamPolicy", f"bucket {bucket.name}")
                call.status = 200
                return _send_json(req, 200, {"kind": "storage#policy", "version": 1,
                                             "bindings": bucket.bindings, "etag": "CAE="})  # fmt: skip
            if method == "GET" and rest == ["o"]:
                call.status = 200
                return _send_json(req, 200, self._list(bucket, query))
            if rest[:1] == ["o"] and len(rest) == 2:
                return self._one_object(req, bucket, rest[1], query, call)
        if seg[:4] == ["download", "storage", "v1", "b"] and len(seg) == 7 and seg[5] == "o":
            return self._download(req, self._bucket(seg[4]), seg[6], query, call)
        if seg[:4] == ["upload", "storage", "v1", "b"] and len(seg) == 6 and seg[5] == "o":
            return self._upload(req, seg[4], query, body, call)
        raise GcsError(404, f"Not Found: {method} {urlsplit(req.path).path}", "notFound")

    def _one_object(
        self, req: _Handler, bucket: FakeBucket, name: str, query: dict[str, str], call: Call
    ) -> None:
        if req.command == "GET":
            self._need(bucket, "storage.objects.get", f"the Google Cloud Storage object {name}")
            if query.get("alt") == "media":
                return self._download(req, bucket, name, query, call)
            obj = self._object(bucket, name)
            call.status = 200
            return _send_json(req, 200, self._resource(bucket.name, obj))
        if req.command == "DELETE":
            self._need(bucket, "storage.objects.delete", f"the Google Cloud Storage object {name}")
            self._object(bucket, name)
            wanted = query.get("ifGenerationMatch")
            self._check_generation(bucket, name, int(wanted) if wanted else None)
            del bucket.objects[name]
            call.status = 204
            req.send_response(204)
            req.send_header("Content-Length", "0")
            req.end_headers()
            return None
        raise GcsError(405, "Method not allowed", "methodNotAllowed")

    def _list(self, bucket: FakeBucket, query: dict[str, str]) -> dict[str, Any]:
        self._need(bucket, "storage.objects.list", f"bucket {bucket.name}")
        prefix = query.get("prefix", "")
        delimiter = query.get("delimiter") or None
        size = max(1, min(1000, int(query.get("maxResults") or 1000)))
        after = base64.urlsafe_b64decode(query["pageToken"]).decode() if query.get("pageToken") else ""
        entries: dict[str, StoredObject | None] = {}
        for name in sorted(bucket.objects):
            if not name.startswith(prefix):
                continue
            if delimiter and delimiter in name[len(prefix) :]:
                cut = name.index(delimiter, len(prefix)) + len(delimiter)
                entries.setdefault(name[:cut], None)
            else:
                entries[name] = bucket.objects[name]
        keys = [k for k in sorted(entries) if k > after]
        page, more = keys[:size], len(keys) > size
        out: dict[str, Any] = {"kind": "storage#objects"}
        items = [self._resource(bucket.name, o) for k in page if (o := entries[k]) is not None]
        prefixes = [k for k in page if entries[k] is None]
        if items:
            out["items"] = items
        if prefixes:
            out["prefixes"] = prefixes
        if more:
            out["nextPageToken"] = base64.urlsafe_b64encode(page[-1].encode()).decode()
        return out

    def _download(
        self, req: _Handler, bucket: FakeBucket, name: str, query: dict[str, str], call: Call
    ) -> None:
        self._need(bucket, "storage.objects.get", f"the Google Cloud Storage object {name}")
        obj = self._object(bucket, name)
        if query.get("generation") and int(query["generation"]) != obj.generation:
            raise GcsError(404, f"No such object: {bucket.name}/{name}", "notFound")
        data, status, start = obj.data, 200, 0
        header = req.headers.get("Range")
        if header:
            match = _RANGE.match(header.strip())
            if match is None:
                raise GcsError(400, f"Invalid range: {header}", "invalid")
            first, last = match.groups()
            size = len(obj.data)
            if first == "":
                start, end = max(0, size - int(last)), size - 1
            else:
                start, end = int(first), min(size - 1, int(last)) if last else size - 1
            if start >= size and size:
                raise GcsError(416, "Requested range not satisfiable", "requestedRangeNotSatisfiable")
            data, status = obj.data[start : end + 1], 206
        cut = self._cuts.pop(0) if self._cuts else None
        call.status = status
        req.send_response(status)
        req.send_header("Content-Type", obj.content_type)
        req.send_header("Content-Length", str(len(data)))
        req.send_header("x-goog-generation", str(obj.generation))
        req.send_header("x-goog-hash", f"crc32c={_crc32c(obj.data)},md5={_md5(obj.data)}")
        req.send_header("x-goog-stored-content-length", str(len(obj.data)))
        if status == 206:
            req.send_header("Content-Range", f"bytes {start}-{start + len(data) - 1}/{len(obj.data)}")
        req.end_headers()
        if cut is not None and cut < len(data):
            req.wfile.write(data[:cut])
            req.wfile.flush()
            req.close_connection = True
            req.connection.shutdown(2)
            return
        req.wfile.write(data)

    # -- uploads ----------------------------------------------------------------------

    def _upload(
        self, req: _Handler, bucket_name: str, query: dict[str, str], body: bytes, call: Call
    ) -> None:
        kind = query.get("uploadType")
        wanted = query.get("ifGenerationMatch")
        if_gen = int(wanted) if wanted else None
        if req.command == "PUT" and kind == "resumable" and query.get("upload_id"):
            return self._chunk(req, query["upload_id"], body, call)
        if req.command != "POST":
            raise GcsError(405, "Method not allowed", "methodNotAllowed")
        self._bucket(bucket_name)
        if kind == "media":
            name = query.get("name") or ""
            ctype = req.headers.get("Content-Type") or "application/octet-stream"
            call.status = 200
            return _send_json(req, 200, self._store(bucket_name, name, body, ctype, if_gen))
        if kind == "multipart":
            metadata, data, ctype = _multipart(req.headers.get("Content-Type") or "", body)
            name = query.get("name") or metadata.get("name") or ""
            call.status = 200
            return _send_json(req, 200, self._store(bucket_name, name, data, ctype, if_gen))
        if kind == "resumable":
            metadata = json.loads(body or b"{}")
            name = query.get("name") or metadata.get("name") or ""
            if not name:
                raise GcsError(400, "Required", "required")
            bucket = self._bucket(bucket_name)
            self._need(bucket, "storage.objects.create", f"the Google Cloud Storage object {name}")
            total = req.headers.get("x-upload-content-length")
            upload_id = secrets.token_urlsafe(12)
            self._sessions[upload_id] = _Session(
                bucket_name, name, req.headers.get("x-upload-content-type") or
                "application/octet-stream", int(total) if total else None, if_gen,
            )  # fmt: skip
            location = (
                f"{self.endpoint}/upload/storage/v1/b/{bucket_name}/o?uploadType=resumable"
                f"&upload_id={upload_id}"
            )
            call.status = 200
            req.send_response(200)
            req.send_header("Location", location)
            req.send_header("Content-Length", "0")
            req.end_headers()
            return None
        raise GcsError(400, f"Invalid upload type: {kind}", "invalid")

    def _chunk(self, req: _Handler, upload_id: str, body: bytes, call: Call) -> None:
        session = self._sessions.get(upload_id)
        if session is None:
            raise GcsError(404, "No such upload session", "notFound")
        if session.done is not None:
            call.status = 200
            return _send_json(req, 200, session.done)
        match = _CONTENT_RANGE.match((req.headers.get("Content-Range") or "").strip())
        if match is None:
            raise GcsError(400, "Invalid Content-Range", "invalid")
        first, last, total = match.groups()
        if total != "*":
            session.total = int(total)
        if first is not None:
            start = int(first)
            if int(last) - start + 1 != len(body):
                raise GcsError(400, "Content-Range does not match the body's length", "invalid")
            have = len(session.data)
            if start > have:
                raise GcsError(
                    400, f"Invalid request. Upload starts at {start}; {have} bytes persisted.",
                    "invalid",
                )  # fmt: skip
            # A chunk sent again after a failure overlaps what is persisted.
            session.data[start:] = body
        if session.total is not None and len(session.data) >= session.total:
            session.done = self._store(
                session.bucket, session.name, bytes(session.data[: session.total]),
                session.content_type, session.if_generation,
            )  # fmt: skip
            call.status = 200
            return _send_json(req, 200, session.done)
        call.status = 308
        req.send_response(308)
        if session.data:
            req.send_header("Range", f"bytes=0-{len(session.data) - 1}")
        req.send_header("Content-Length", "0")
        req.end_headers()
        return None


def _upload_name(kind: str | None, query: dict[str, str], ctype: str, body: bytes) -> str | None:
    """The object an upload request writes, where the request says it."""
    if query.get("name"):
        return query["name"]
    try:
        if kind == "multipart":
            return str(_multipart(ctype, body)[0].get("name"))
        if kind == "resumable":
            return str(json.loads(body or b"{}").get("name"))
    except (GcsError, ValueError, AttributeError):
        return None
    return None


def _multipart(content_type: str, body: bytes) -> tuple[dict[str, Any], bytes, str]:
    """The metadata, bytes and content type of a multipart/related upload."""
    match = re.search(r'boundary="?([^";]+)"?', content_type)
    if match is None or not content_type.startswith("multipart/related"):
        raise GcsError(400, "Invalid multipart request", "invalid")
    marker = b"--" + match.group(1).encode()
    pieces = body.split(marker)
    if len(pieces) < 4 or not pieces[-1].startswith(b"--"):
        raise GcsError(400, "Invalid multipart request: missing parts", "invalid")
    parts = []
    for piece in pieces[1:3]:
        head, sep, data = piece.removeprefix(b"\r\n").partition(b"\r\n\r\n")
        if not sep:
            raise GcsError(400, "Invalid multipart request: a part has no headers", "invalid")
        parts.append((head.decode("latin-1").lower(), data.removesuffix(b"\r\n")))
    metadata = json.loads(parts[0][1] or b"{}")
    ctype = re.search(r"content-type:\s*([^\r\n]+)", parts[1][0])
    return metadata, parts[1][1], ctype.group(1) if ctype else "application/octet-stream"


def _send_json(req: _Handler, status: int, payload: Any) -> None:
    data = json.dumps(payload).encode()
    req.send_response(status)
    req.send_header("Content-Type", "application/json; charset=UTF-8")
    req.send_header("Content-Length", str(len(data)))
    req.end_headers()
    req.wfile.write(data)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def _serve(self) -> None:
        self.server.fake.handle(self)  # type: ignore[attr-defined]

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


def service_account_key(fake: FakeGcs, email: str) -> dict[str, Any]:
    """A service-account JSON key (a real RSA key) whose ``token_uri`` is
    the fake's token endpoint: Google's client signs in with it as it
    would with Google, and the fake knows who calls."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    return {
        "type": "service_account",
        "project_id": email.split("@")[1].split(".")[0],
        "private_key_id": "0123456789abcdef",
        "private_key": pem,
        "client_email": email,
        "client_id": "1",
        "token_uri": f"{fake.endpoint}/token",
    }
