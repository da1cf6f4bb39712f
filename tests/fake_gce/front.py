"""The HTTP front of the fake GCE: the routes of the v1 REST API (method and
path -> the discovery name of the call, ``instances.insert`` say), request
parsing, the record of every call (``calls``: for assertions such as "a dry
run made no mutating call"), and the errors as GCE writes them: an unknown
zone (400 invalid), a refusal of catalog.py, a bad list filter (400) and
any ``ApiError`` become ``{"error": {"code", "message", "errors": [...]}}``.

It owns no resource: each call goes to the handler its resource part lists
(instances.py, firewalls.py, ...), after the hooks and HTTP faults of
faults.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fake_gce import catalog
from tests.fake_gce.api import ApiError, Call, Handler
from tests.fake_gce.faults import Faults
from tests.fake_gce.filters import FilterError
from tests.fake_gce.world import World

_P = r"^/compute/v1/projects/(?P<project>[^/]+)"
_Z = _P + r"/zones/(?P<zone>[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(p + "$"), op)
    for m, p, op in [
        ("GET", _P + r"/aggregated/instances", "instances.aggregatedList"),
        ("GET", _Z + r"/instances", "instances.list"),
        ("POST", _Z + r"/instances", "instances.insert"),
        ("POST", _Z + r"/instances/bulkInsert", "instances.bulkInsert"),
        ("GET", _Z + r"/instances/(?P<name>[^/]+)", "instances.get"),
        ("DELETE", _Z + r"/instances/(?P<name>[^/]+)", "instances.delete"),
        ("POST", _Z + r"/instances/(?P<name>[^/]+)/start", "instances.start"),
        ("POST", _Z + r"/instances/(?P<name>[^/]+)/stop", "instances.stop"),
        ("POST", _Z + r"/instances/(?P<name>[^/]+)/resume", "instances.resume"),
        ("POST", _Z + r"/instances/(?P<name>[^/]+)/setLabels", "instances.setLabels"),
        ("POST", _Z + r"/instances/(?P<name>[^/]+)/setMetadata", "instances.setMetadata"),
        ("GET", _Z + r"/instances/(?P<name>[^/]+)/getGuestAttributes",
         "instances.getGuestAttributes"),
        ("GET", _P + r"/global/firewalls", "firewalls.list"),
        ("POST", _P + r"/global/firewalls", "firewalls.insert"),
        ("GET", _P + r"/global/firewalls/(?P<name>[^/]+)", "firewalls.get"),
        ("PATCH", _P + r"/global/firewalls/(?P<name>[^/]+)", "firewalls.patch"),
        ("PUT", _P + r"/global/firewalls/(?P<name>[^/]+)", "firewalls.update"),
        ("DELETE", _P + r"/global/firewalls/(?P<name>[^/]+)", "firewalls.delete"),
        ("GET", r"^/compute/v1/projects/(?P<image_project>[^/]+)/global/images/family/"
         r"(?P<name>[^/]+)", "images.getFromFamily"),
        ("GET", r"^/compute/v1/projects/(?P<image_project>[^/]+)/global/images/(?P<name>[^/]+)",
         "images.get"),
        ("GET", _P + r"/global/networks/(?P<name>[^/]+)", "networks.get"),
        ("GET", _P, "projects.get"),
        ("GET", _Z + r"/operations/(?P<name>[^/]+)", "zoneOperations.get"),
        ("POST", _Z + r"/operations/(?P<name>[^/]+)/wait", "zoneOperations.wait"),
        ("GET", _P + r"/global/operations/(?P<name>[^/]+)", "globalOperations.get"),
        ("POST", _P + r"/global/operations/(?P<name>[^/]+)/wait", "globalOperations.wait"),
    ]
]

ROUTED_OPS = frozenset(op for _, _, op in _ROUTES)


def route(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    """(the call's discovery name, its path parameters); None: no such API."""
    for route_method, pattern, op in _ROUTES:
        if route_method != method:
            continue
        match = pattern.match(path)
        if match:
            return op, match.groupdict()
    return None


class Front:
    def __init__(
        self,
        world: World,
        faults: Faults,
        handlers: Mapping[str, Handler],
        seen_project: Callable[[str], object],
    ) -> None:
        """``handlers``: discovery name -> its handler, one for each route;
        ``seen_project(project)`` runs first for each call naming one."""
        if unhandled := sorted(ROUTED_OPS - handlers.keys()):
            raise ValueError(f"no handler for {', '.join(unhandled)}")
        self._world = world
        self._faults = faults
        self._handlers = dict(handlers)
        self._seen_project = seen_project
        self.calls: list[Call] = []
        self._in_flight = 0  # mutating requests being handled now
        self._idle = threading.Condition(world.lock)

    def listen(self, host: str, port: int) -> ThreadingHTTPServer:
        """A server answering from this front (not yet serving)."""
        server = ThreadingHTTPServer((host, port), _Handler)
        server.daemon_threads = True
        server.front = self  # type: ignore[attr-defined]
        return server

    # -- the call log -------------------------------------------------------------------

    def mutating_calls(self) -> list[Call]:
        with self._world.lock:
            return [c for c in self.calls if c.mutating]

    def ops_called(self) -> list[str]:
        with self._world.lock:
            return [c.op for c in self.calls]

    def reset_calls(self) -> None:
        with self._world.lock:
            self.calls.clear()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no mutating request is being answered: every one a client
        sent has been accepted (its instance exists) or refused."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout):
                raise TimeoutError(f"{self._in_flight} mutating requests still in flight")

    # -- answering ----------------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        authorization: str | None,
    ) -> tuple[int, Any]:
        """(HTTP status, JSON answer) of one request."""
        found = route(method, path)
        if found is None:
            call = Call("unknown", method, path, query, body, None, None, None, authorization)
            status, payload = 404, ApiError(404, f"no such API path: {method} {path}",
                                            "notFound").payload()
            call.status = status
            with self._world.lock:
                self.calls.append(call)
            return status, payload
        op, params = found
        if params.get("project"):
            self._seen_project(params["project"])
        name = params.get("name") or (body.get("name") if isinstance(body, dict) else None)
        call = Call(
            op, method, path, query, body, params.get("project"), params.get("zone"), name,
            authorization,
        )
        with self._world.lock:
            self.calls.append(call)
            if call.mutating:
                self._in_flight += 1
        try:
            return self._answer(call, params, query, body)
        finally:
            if call.mutating:
                with self._world.lock:
                    self._in_flight -= 1
                    self._idle.notify_all()

    def _answer(
        self, call: Call, params: dict[str, str], query: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        try:
            self._faults.run_hooks(call)
            if call.zone is not None and call.zone not in self._world.zones:
                # The whole body of real GCE's answer (inspec/inspec-gcp#301):
                # {"code": 400, "message": "Invalid value for field 'zone':
                # 'us-east1'. Unknown zone.", "errors": [{..., "reason": "invalid"}]}
                raise ApiError(
                    400, f"Invalid value for field 'zone': '{call.zone}'. Unknown zone.", "invalid"
                )
            self._faults.http_fault(call)
            handler = self._handlers[call.op]
            status, payload = 200, handler(call, params, query, body)
        except ApiError as exc:
            status, payload = exc.status, exc.payload()
        except catalog.Refusal as exc:
            status = exc.status
            payload = ApiError(exc.status, exc.message, exc.reason).payload()
        except FilterError as exc:
            status = 400
            payload = ApiError(
                400,
                f"Invalid value for field 'filter': '{query.get('filter')}'. "
                f"Invalid list filter expression ({exc}).",
                "invalid",
            ).payload()
        call.status = status
        return status, payload


class _Handler(BaseHTTPRequestHandler):
    # Keep-alive, as the client's pooled session expects.
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body are separate writes: with Nagle on, the body
        # waits for the client's delayed ACK (~40 ms per call).
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def _serve(self) -> None:
        url = urlsplit(self.path)
        query = dict(parse_qsl(url.query, keep_blank_values=True))
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        front: Front = self.server.front  # type: ignore[attr-defined]
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            status, payload = 400, ApiError(400, f"Invalid JSON payload: {exc}",
                                            "parseError").payload()
        else:
            status, payload = front.handle(
                self.command, url.path, query, body, self.headers.get("Authorization")
            )
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_DELETE = do_PATCH = do_PUT = _serve

    def handle(self) -> None:
        # A client that went away (a deploy.py killed mid-call) is no error here.
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            super().handle()

    def log_message(self, format: str, *args: Any) -> None:
        # The call log is the record; stderr noise would drown test output.
        return
