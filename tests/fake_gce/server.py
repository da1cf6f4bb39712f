"""A fake Compute Engine v1 REST API that the real google-cloud-compute client talks to.

``FakeGce`` is a ``ThreadingHTTPServer`` on a loopback port that speaks the
JSON of the real API: instances (insert, bulkInsert, get, list,
aggregatedList, start, stop, resume, delete, setLabels, setMetadata,
getGuestAttributes),
firewalls (insert, get, list, patch, update, delete) and zone/global operations
(get, wait). Point a client at it with
``ClientOptions(api_endpoint=fake.endpoint)`` and ``AnonymousCredentials()``.

What it models, because the provider depends on it:

* Operations are resources of their own: a mutating call answers 200 with
  an Operation (status RUNNING) at once; the work happens on a thread and
  the Operation becomes DONE, with ``error.errors[].code`` and
  ``httpErrorStatusCode`` when it failed (stockout, quota). ``wait`` blocks
  until DONE or ``wait_max_s``, as the real one does for up to 2 minutes.
* Instance states move PROVISIONING -> STAGING -> RUNNING (the insert
  operation is DONE at STAGING, so a client must still wait for RUNNING),
  STAGING -> RUNNING on start, STOPPING -> TERMINATED on stop and
  STOPPING -> gone on delete, each with the latency in ``Latency``.
  Operations on one instance run one after another, as GCE serialises them.
* networkIP is assigned at create (10.128.x.y) and kept; natIP (TEST-NET-3,
  203.0.113.x, never contacted) is assigned when the instance runs, dropped
  when it stops, and is a new one after each start.
* Guest attributes: with ``enable-guest-attributes=TRUE`` in its metadata, a
  RUNNING instance's guest agent publishes its SSH host keys under
  ``hostkeys/<type>`` = base64 (what ``InstanceBackend.host_keys`` says),
  ``Latency.host_keys`` seconds after it runs; until then, when disabled
  or stopped, ``getGuestAttributes`` answers 404.
* Errors have the real shape ``{"error": {"code", "message", "errors":
  [{"message", "domain", "reason"}]}}``: 404 notFound, 409 alreadyExists,
  400 invalid (an unknown zone too) or badRequest, 412 conditionNotMet
  (label / metadata fingerprints), 403 quotaExceeded, 503 backendError.
* Machine types that come with Local SSD (``catalog.LOCAL_SSD_DISKS``)
  list it as SCRATCH disks, and ``stop`` refuses them without
  ``discardLocalSsd`` as GCE does.

* What is offered (``catalog.py``): an insert is refused as GCE refuses it
  when its machine type or GPU is not in the zone, its GPUs do not fit the
  machine family or count, its boot disk is smaller than its image or of a
  type the family cannot use, or its network is custom-mode without a
  subnetwork of the zone's region. ``images.get``/``getFromFamily``,
  ``networks.get`` and ``projects.get`` (commonInstanceMetadata:
  ``project_metadata``) answer from the same tables. Each project starts
  with the auto-mode ``default`` network and GCE's four ``default-allow-*``
  rules at 65534; ``reachable`` evaluates the rules as GCE does.

Faults are injected per call (``fail``, ``stockout``, ``quota_exceeded``,
``hook``) and by hand (``preempt``, ``suspend``, ``remove_instance``).
Every request is in ``calls`` for assertions such as "a dry run made no
mutating call".

What an instance *is* is up to an ``InstanceBackend``: the default keeps
nothing but the addresses the fake hands out; a backend whose instances are
containers answers ``on_create`` with the container's address.
"""

from __future__ import annotations

import contextlib
import json
import re
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fake_gce import catalog
from tests.fake_gce.addresses import AddressPool
from tests.fake_gce.api import (
    ApiError,
    Call,
    Handler,
)
from tests.fake_gce.backend import InstanceBackend
from tests.fake_gce.faults import Faults
from tests.fake_gce.filters import FilterError
from tests.fake_gce.firewalls import Firewalls
from tests.fake_gce.guest import GuestAttributes
from tests.fake_gce.inserts import Inserts
from tests.fake_gce.instances import Instances
from tests.fake_gce.lifecycle import Lifecycle
from tests.fake_gce.operations import Operations
from tests.fake_gce.projects import Projects
from tests.fake_gce.world import DEFAULT_ZONES, Latency, World

# -- the fake ------------------------------------------------------------------------------


class FakeGce:
    def __init__(
        self,
        *,
        latency: Latency | None = None,
        backend: InstanceBackend | None = None,
        zones: Sequence[str] = DEFAULT_ZONES,
        wait_max_s: float = 5.0,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self._world = World(latency or Latency(), backend or InstanceBackend(), zones, wait_max_s)
        self._operations = Operations(self._world)
        self._faults = Faults(self._world)
        # discovery name -> its handler, from the part of its resource
        self._handlers: dict[str, Handler] = {**self._operations.handlers()}
        # Each needs the other: a new project gets the default rules, a rule
        # is checked against its project's networks.
        self._rules = Firewalls(self._world, self._operations, lambda p: self._projects.networks(p))
        self._projects = Projects(self._world, on_new=self._rules.add_defaults)
        self._handlers.update(self._projects.handlers())
        self._handlers.update(self._rules.handlers())
        self._instances = Instances(self._world, self._operations)
        addresses = AddressPool(self._world, self._instances.nat_ips)
        self._inserts = Inserts(
            self._world, self._instances, self._operations, self._faults, addresses,
            self._projects.networks,
        )
        self._lifecycle = Lifecycle(
            self._world, self._instances, self._operations, self._faults, addresses
        )
        self._guest = GuestAttributes(self._world, self._instances)
        for part in (self._instances, self._inserts, self._lifecycle, self._guest):
            self._handlers.update(part.handlers())
        self.calls: list[Call] = []
        self._host = host
        self._port = port
        self._in_flight = 0  # mutating requests being handled now
        self._idle = threading.Condition(self._lock)
        self._server: ThreadingHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------

    def start(self) -> FakeGce:
        server = ThreadingHTTPServer((self._host, self._port), _Handler)
        server.daemon_threads = True
        server.fake = self  # type: ignore[attr-defined]
        self._server = server
        self._serve_thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
            name="fake-gce",
        )
        self._serve_thread.start()
        self.backend.watch(self.guest_shutdown)
        return self

    def stop(self) -> None:
        self._world.closing.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        self._operations.join(timeout=5)
        self.backend.close()

    def __enter__(self) -> FakeGce:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self._server is None:
            raise RuntimeError("the fake is not started")
        host, port = self._server.server_address[:2]
        if isinstance(host, bytes):  # typeshed allows it; an IPv4 server never has it
            host = host.decode()
        return f"http://{host}:{port}"

    # -- settings a test may change between calls -------------------------------------

    @property
    def latency(self) -> Latency:
        return self._world.latency

    @latency.setter
    def latency(self, value: Latency) -> None:
        self._world.latency = value

    @property
    def backend(self) -> InstanceBackend:
        return self._world.backend

    @backend.setter
    def backend(self, value: InstanceBackend) -> None:
        self._world.backend = value

    @property
    def wait_max_s(self) -> float:
        """The longest an ``operations.wait`` blocks."""
        return self._world.wait_max_s

    @wait_max_s.setter
    def wait_max_s(self, value: float) -> None:
        self._world.wait_max_s = value

    @property
    def zones(self) -> list[str]:
        return self._world.zones

    @property
    def internal_errors(self) -> list[BaseException]:
        """Failures of operation threads that are no modelled API behaviour."""
        return self._world.internal_errors

    @property
    def project_metadata(self) -> dict[str, dict[str, str]]:
        """Project -> its commonInstanceMetadata (key -> value), as projects.get shows it."""
        return self._projects.metadata

    @property
    def _lock(self) -> threading.RLock:
        """The one lock of every table (hold it to change a stored resource)."""
        return self._world.lock

    @property
    def _firewalls(self) -> dict[tuple[str, str], dict[str, Any]]:
        """(project, name) -> the stored rule, to change one behind the API."""
        return self._rules.rules

    def _insert(self, project: str, zone: str, body: Any) -> Any:
        """An ``instances.insert`` with no HTTP call (and no call recorded)."""
        return self._inserts.insert(project, zone, body)

    # -- faults (faults.py) -----------------------------------------------------------

    def fail(
        self,
        op: str,
        status: int = 503,
        *,
        times: int | None = 1,
        reason: str | None = None,
        message: str | None = None,
        name: str | None = None,
        zone: str | None = None,
    ) -> None:
        """An HTTP error for the next calls of ``op``: see ``Faults.fail``."""
        self._faults.fail(
            op, status, times=times, reason=reason, message=message, name=name, zone=zone
        )

    def stockout(
        self,
        zone: str | None,
        *,
        code: str = "ZONE_RESOURCE_POOL_EXHAUSTED",
        after: int = 0,
        times: int | None = None,
        leave_instance: bool = False,
        ops: Sequence[str] = ("insert", "bulkInsert"),
        http: bool = False,
    ) -> None:
        """Creates in ``zone`` run out of capacity: see ``Faults.stockout``."""
        self._faults.stockout(
            zone, code=code, after=after, times=times, leave_instance=leave_instance, ops=ops,
            http=http,
        )

    def quota_exceeded(
        self,
        zone: str | None,
        *,
        metric: str = "CPUS",
        http: bool = False,
        times: int | None = None,
    ) -> None:
        """Creates in ``zone`` exceed a quota: see ``Faults.quota_exceeded``."""
        self._faults.quota_exceeded(zone, metric=metric, http=http, times=times)

    def hook(
        self,
        op: str,
        fn: Callable[[Call], None],
        *,
        name: str | None = None,
        times: int | None = 1,
    ) -> None:
        """``fn(call)`` runs when ``op`` arrives: see ``Faults.hook``."""
        self._faults.hook(op, fn, name=name, times=times)

    def clear_faults(self) -> None:
        self._faults.clear()

    # -- things that happen outside the API (lifecycle.py) ------------------------------

    def preempt(self, name: str, zone: str | None = None) -> None:
        """GCE reclaims a Spot VM: see ``Lifecycle.preempt``."""
        self._lifecycle.preempt(name, zone)

    def guest_shutdown(self, name: str, zone: str | None = None) -> bool:
        """The guest powered itself off: see ``Lifecycle.guest_shutdown``."""
        return self._lifecycle.guest_shutdown(name, zone)

    def suspend(self, name: str, zone: str | None = None) -> None:
        self._lifecycle.suspend(name, zone)

    def remove_instance(self, name: str, zone: str | None = None) -> None:
        """Someone deleted the instance in the console: gone at once."""
        self._lifecycle.remove_instance(name, zone)

    def set_guest_attribute(
        self, name: str, path: str, value: str | None, zone: str | None = None
    ) -> None:
        """Publish ``path`` as the guest would: see ``GuestAttributes.set``."""
        self._guest.set(name, path, value, zone)

    # -- inspection -----------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        return self._instances.resources()

    def instance(self, name: str, zone: str | None = None) -> dict[str, Any]:
        return self._instances.resource(name, zone)

    def firewalls(self, *, defaults: bool = False) -> list[dict[str, Any]]:
        """The firewall rules; GCE's own default-allow-* only with ``defaults``."""
        return self._rules.resources(defaults=defaults)

    # -- projects, networks, reachability ------------------------------------------------

    def add_network(
        self, name: str, subnets: Mapping[str, Sequence[str]], *, project: str = "fake-project",
        auto: bool = False,
    ) -> None:
        """A VPC network: see ``Projects.add_network``."""
        self._projects.add_network(name, subnets, project=project, auto=auto)

    def reachable(
        self, name: str, port: int, *, source_ip: str | None = None, source: str | None = None
    ) -> bool:
        """Whether a TCP connection to ``port`` of instance ``name`` gets
        through the firewall rules: from the address ``source_ip`` (outside),
        or from the instance ``source`` (its internal IP and network tags)."""
        target = self.instance(name)
        other = self.instance(source) if source is not None else None
        return self._rules.reachable(target, port, source_ip=source_ip, source=other)

    def pending_stop(self, name: str, zone: str | None = None) -> None:
        """A stop waiting for the guest: see ``Lifecycle.pending_stop``."""
        self._lifecycle.pending_stop(name, zone)

    def firewall(self, name: str) -> dict[str, Any] | None:
        return self._rules.find(name)

    def operations(self) -> list[dict[str, Any]]:
        return self._operations.resources()

    def mutating_calls(self) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.mutating]

    def ops_called(self) -> list[str]:
        with self._lock:
            return [c.op for c in self.calls]

    def reset_calls(self) -> None:
        with self._lock:
            self.calls.clear()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no mutating request is being answered: every one a client
        sent has been accepted (its instance exists) or refused."""
        with self._idle:
            if not self._idle.wait_for(lambda: self._in_flight == 0, timeout):
                raise TimeoutError(f"{self._in_flight} mutating requests still in flight")

    def wait_quiet(self, timeout: float = 10.0) -> None:
        """Until no operation is running (all DONE)."""
        self._operations.wait_quiet(timeout)

    # -- request handling -----------------------------------------------------------------

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        authorization: str | None,
    ) -> tuple[int, Any]:
        route = _route(method, path)
        if route is None:
            call = Call("unknown", method, path, query, body, None, None, None, authorization)
            status, payload = 404, ApiError(404, f"no such API path: {method} {path}",
                                            "notFound").payload()
            call.status = status
            with self._lock:
                self.calls.append(call)
            return status, payload
        op, params = route
        if params.get("project"):
            self._projects.networks(params["project"])
        name = params.get("name") or (body.get("name") if isinstance(body, dict) else None)
        call = Call(
            op, method, path, query, body, params.get("project"), params.get("zone"), name,
            authorization,
        )
        with self._lock:
            self.calls.append(call)
            if call.mutating:
                self._in_flight += 1
        try:
            return self._handle(call, op, params, query, body)
        finally:
            if call.mutating:
                with self._lock:
                    self._in_flight -= 1
                    self._idle.notify_all()

    def _handle(
        self, call: Call, op: str, params: dict[str, str], query: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        try:
            self._faults.run_hooks(call)
            if call.zone is not None and call.zone not in self.zones:
                # The whole body of real GCE's answer (inspec/inspec-gcp#301):
                # {"code": 400, "message": "Invalid value for field 'zone':
                # 'us-east1'. Unknown zone.", "errors": [{..., "reason": "invalid"}]}
                raise ApiError(
                    400, f"Invalid value for field 'zone': '{call.zone}'. Unknown zone.", "invalid"
                )
            self._faults.http_fault(call)
            handler = self._handlers[op]
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


def _route(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    for route_method, pattern, op in _ROUTES:
        if route_method != method:
            continue
        match = pattern.match(path)
        if match:
            return op, match.groupdict()
    return None


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
        fake: FakeGce = self.server.fake  # type: ignore[attr-defined]
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError as exc:
            status, payload = 400, ApiError(400, f"Invalid JSON payload: {exc}",
                                            "parseError").payload()
        else:
            status, payload = fake.handle(
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


def running_names(fake: FakeGce, statuses: Iterable[str] = ("RUNNING",)) -> list[str]:
    """Names of the fake's instances in one of ``statuses``, sorted."""
    wanted = set(statuses)
    return sorted(i["name"] for i in fake.instances() if i["status"] in wanted)
