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
import copy
import ipaddress
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from tests.fake_gce import catalog
from tests.fake_gce.api import (
    API_ROOT,
    ApiError,
    Call,
    Handler,
    OpFailure,
    fingerprint,
    now,
    page,
)
from tests.fake_gce.backend import InstanceBackend
from tests.fake_gce.faults import Faults
from tests.fake_gce.filters import FilterError, compile_filter
from tests.fake_gce.firewalls import Firewalls
from tests.fake_gce.instance_body import check_labels, instance_resource
from tests.fake_gce.operations import Operations
from tests.fake_gce.projects import Projects
from tests.fake_gce.world import DEFAULT_ZONES, Closing, Latency, World


@dataclass
class _Instance:
    project: str
    zone: str
    name: str
    resource: dict[str, Any]
    # Operations on one instance run one at a time, in order.
    op_lock: threading.Lock = field(default_factory=threading.Lock)
    deleted: bool = False
    backend_created: bool = False
    running_since: float | None = None  # monotonic time it last became RUNNING
    # Set by tests (``set_guest_attribute``): path -> value, over the backend's.
    guest_attributes: dict[str, str] = field(default_factory=dict)


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
        # discovery name -> its handler, for the resources in parts of their own
        self._handlers: dict[str, Handler] = {**self._operations.handlers()}
        # Each needs the other: a new project gets the default rules, a rule
        # is checked against its project's networks.
        self._rules = Firewalls(self._world, self._operations, lambda p: self._projects.networks(p))
        self._projects = Projects(self._world, on_new=self._rules.add_defaults)
        self._handlers.update(self._projects.handlers())
        self._handlers.update(self._rules.handlers())
        self.calls: list[Call] = []
        self._host = host
        self._port = port
        self._instances: dict[tuple[str, str, str], _Instance] = {}
        self._in_flight = 0  # mutating requests being handled now
        self._idle = threading.Condition(self._lock)
        self._next_internal = 2
        self._next_nat = 10
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

    # -- things that happen outside the API -------------------------------------------

    def preempt(self, name: str, zone: str | None = None) -> None:
        """GCE reclaims a Spot VM: TERMINATED at once, external IP gone, and a
        ``compute.instances.preempted`` operation in the zone."""
        inst = self._find(name, zone)
        with self._lock:
            res = inst.resource
            res["status"] = "TERMINATED"
            res["lastStopTimestamp"] = now()
            self._drop_nat(res)
            snapshot = copy.deepcopy(res)
            op = self._operations.new(
                inst.project, f"zones/{inst.zone}", "compute.instances.preempted", res
            )
        self.backend.on_stop(snapshot)
        self._operations.finish(op)

    def guest_shutdown(self, name: str, zone: str | None = None) -> bool:
        """The guest powered itself off (``shutdown -h now`` inside it): GCE
        makes the instance TERMINATED (disks kept, external IP gone) and
        records a ``compute.instances.guestTerminate`` operation. False
        when it was not RUNNING: a stop, delete or preemption of the API
        had stopped the guest."""
        try:
            inst = self._find(name, zone)
        except KeyError:
            return False
        with self._lock:
            res = inst.resource
            if inst.deleted or res["status"] != "RUNNING":
                return False
            res["status"] = "TERMINATED"
            res["lastStopTimestamp"] = now()
            self._drop_nat(res)
            op = self._operations.new(
                inst.project, f"zones/{inst.zone}", "compute.instances.guestTerminate", res
            )
        self._operations.finish(op)
        return True

    def suspend(self, name: str, zone: str | None = None) -> None:
        """The instance is SUSPENDED (as ``instances.suspend`` leaves it)."""
        inst = self._find(name, zone)
        with self._lock:
            inst.resource["status"] = "SUSPENDED"
            self._drop_nat(inst.resource)
            snapshot = copy.deepcopy(inst.resource)
        self.backend.on_stop(snapshot)

    def remove_instance(self, name: str, zone: str | None = None) -> None:
        """Someone deleted the instance in the console: gone at once."""
        inst = self._find(name, zone)
        with self._lock:
            inst.deleted = True
            self._instances.pop((inst.project, inst.zone, inst.name), None)
            snapshot = copy.deepcopy(inst.resource)
        if inst.backend_created:
            self.backend.on_delete(snapshot)

    # -- inspection -----------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(i.resource)
                for _, i in sorted(self._instances.items(), key=lambda kv: kv[0])
            ]

    def instance(self, name: str, zone: str | None = None) -> dict[str, Any]:
        inst = self._find(name, zone)
        with self._lock:
            return copy.deepcopy(inst.resource)

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
        """A stop waiting for the guest to shut down: PENDING_STOP, then
        TERMINATED after ``latency.stop``; GCE refuses to start it meanwhile."""
        inst = self._find(name, zone)
        with self._lock:
            inst.resource["status"] = "PENDING_STOP"

        def later() -> None:
            try:
                self._world.sleep(self.latency.stop)
            except Closing:
                return
            with self._lock:
                snapshot = copy.deepcopy(inst.resource)
            self.backend.on_stop(snapshot)
            with self._lock:
                if inst.resource["status"] == "PENDING_STOP":
                    inst.resource["status"] = "TERMINATED"
                    inst.resource["lastStopTimestamp"] = now()
                    self._drop_nat(inst.resource)

        threading.Thread(target=later, daemon=True, name=f"pending-stop-{name}").start()

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

    def _find(self, name: str, zone: str | None) -> _Instance:
        with self._lock:
            found = [
                i
                for (_, z, n), i in self._instances.items()
                if n == name and (zone is None or z == zone)
            ]
        if len(found) != 1:
            raise KeyError(f"{len(found)} instances named {name} (zone {zone})")
        return found[0]

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
            handler = self._handlers.get(op) or getattr(self, "_api_" + op.replace(".", "_"))
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

    # -- instances --------------------------------------------------------------------

    def _instance(self, project: str, zone: str, name: str) -> _Instance:
        with self._lock:
            inst = self._instances.get((project, zone, name))
        if inst is None:
            raise ApiError(
                404,
                f"The resource 'projects/{project}/zones/{zone}/instances/{name}' was not found",
                "notFound",
            )
        return inst

    def _api_instances_get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        with self._lock:
            return copy.deepcopy(inst.resource)

    def _api_instances_getGuestAttributes(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        path = query.get("queryPath", "")
        if not re.match(r"^([\w-]+/[\w-]*)?$", path):
            raise ApiError(400, f"Invalid value for field 'queryPath': '{path}'", "invalid")
        with self._lock:
            resource = copy.deepcopy(inst.resource)
            since = inst.running_since
            overrides = dict(inst.guest_attributes)
        items = {i.get("key"): i.get("value") for i in resource["metadata"]["items"]}
        attributes: dict[str, str] = {}
        if (
            str(items.get("enable-guest-attributes", "")).upper() == "TRUE"
            and resource["status"] == "RUNNING"
            and since is not None
            and time.monotonic() - since >= self.latency.host_keys
        ):
            for line in self.backend.host_keys(resource):
                fields = line.split()
                if len(fields) >= 2:
                    attributes[f"hostkeys/{fields[0]}"] = fields[1]
            attributes.update(overrides)
        base = f"projects/{p['project']}/zones/{p['zone']}/instances/{p['name']}"
        answer: dict[str, Any] = {
            "kind": "compute#guestAttributes",
            "queryPath": path,
            "selfLink": f"{API_ROOT}/{base}/guestAttributes/{path}",
        }
        if path.endswith("/") or not path:
            found = [
                {"namespace": k.split("/", 1)[0], "key": k.split("/", 1)[1], "value": v}
                for k, v in sorted(attributes.items())
                if k.startswith(path)
            ]
            if found:
                answer["queryValue"] = {"items": found}
        elif path in attributes:
            answer["variableKey"] = path
            answer["variableValue"] = attributes[path]
        if "queryValue" not in answer and "variableValue" not in answer:
            raise ApiError(
                404, f"The resource '{base}/guestAttributes/{path}' was not found", "notFound"
            )
        return answer

    def set_guest_attribute(
        self, name: str, path: str, value: str | None, zone: str | None = None
    ) -> None:
        """Publish ``path`` (``namespace/key``) as the guest would, over
        what the backend publishes; None removes it again."""
        inst = self._find(name, zone)
        with self._lock:
            if value is None:
                inst.guest_attributes.pop(path, None)
            else:
                inst.guest_attributes[path] = value

    def _api_instances_list(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        match = compile_filter(query.get("filter"))
        with self._lock:
            items = [
                copy.deepcopy(i.resource)
                for (proj, zone, _), i in sorted(self._instances.items())
                if proj == p["project"] and zone == p["zone"] and match(i.resource)
            ]
        base = f"projects/{p['project']}/zones/{p['zone']}/instances"
        return page("compute#instanceList", base, items, query)

    def _api_instances_aggregatedList(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        match = compile_filter(query.get("filter"))
        project = p["project"]
        with self._lock:
            by_zone: dict[str, list[dict[str, Any]]] = {zone: [] for zone in self.zones}
            for (proj, zone, _), inst in sorted(self._instances.items()):
                if proj == project and match(inst.resource):
                    by_zone.setdefault(zone, []).append(copy.deepcopy(inst.resource))
        items: dict[str, Any] = {}
        for zone, instances in sorted(by_zone.items()):
            scope = f"zones/{zone}"
            if instances:
                items[scope] = {"instances": instances}
            else:
                items[scope] = {
                    "warning": {
                        "code": "NO_RESULTS_ON_PAGE",
                        "message": f"There are no results for scope '{scope}' on this page.",
                        "data": [{"key": "scope", "value": scope}],
                    }
                }
        return {
            "kind": "compute#instanceAggregatedList",
            "id": f"projects/{project}/aggregated/instances",
            "items": items,
            "selfLink": f"{API_ROOT}/projects/{project}/aggregated/instances",
        }

    def _api_instances_insert(
        self, call: Call, p: dict[str, str], query: dict[str, str], body: Any
    ) -> Any:
        return self._operations.dedup(
            query, lambda: self._insert(p["project"], p["zone"], body)
        )

    def _insert(self, project: str, zone: str, body: Any) -> Any:
        resource = instance_resource(project, zone, body, self._projects.networks)
        key = (project, zone, resource["name"])
        with self._lock:
            if key in self._instances:
                raise ApiError(
                    409,
                    f"The resource 'projects/{project}/zones/{zone}/instances/"
                    f"{resource['name']}' already exists",
                    "alreadyExists",
                )
            fate = self._faults.capacity_fate(project, zone, "insert")
            inst = _Instance(project, zone, resource["name"], resource)
            self._instances[key] = inst
            op = self._operations.new(project, f"zones/{zone}", "insert", resource)
            answer = copy.deepcopy(op.resource)
        self._operations.spawn(
            op, lambda: self._create(inst, fate, lambda: self._operations.finish(op))
        )
        return answer

    def _create(
        self,
        inst: _Instance,
        fate: tuple[OpFailure, bool] | None,
        on_staged: Callable[[], None],
    ) -> None:
        """PROVISIONING -> STAGING (``on_staged``) -> RUNNING, or a stockout."""
        with inst.op_lock:
            if fate is not None:
                failure, leave = fate
                self._world.sleep(self.latency.provision_of(inst.name))
                with self._lock:
                    if leave:
                        inst.resource["status"] = "TERMINATED"
                    else:
                        inst.deleted = True
                        self._instances.pop((inst.project, inst.zone, inst.name), None)
                raise failure
            with self._lock:
                snapshot = copy.deepcopy(inst.resource)
            addresses = self.backend.on_create(snapshot)
            inst.backend_created = True
            with self._lock:
                nic = inst.resource["networkInterfaces"][0]
                nic["networkIP"] = addresses.network_ip or self._internal_ip()
            self._world.sleep(self.latency.provision_of(inst.name))
            with self._lock:
                if inst.deleted or inst.resource["status"] != "PROVISIONING":
                    on_staged()
                    return
                inst.resource["status"] = "STAGING"
                self._give_nat(inst.resource, addresses.nat_ip)
            on_staged()
            self._world.sleep(self.latency.staging)
            with self._lock:
                if not inst.deleted and inst.resource["status"] == "STAGING":
                    inst.resource["status"] = "RUNNING"
                    inst.resource["lastStartTimestamp"] = now()
                    inst.running_since = time.monotonic()

    def _api_instances_bulkInsert(
        self, call: Call, p: dict[str, str], query: dict[str, str], body: Any
    ) -> Any:
        return self._operations.dedup(
            query, lambda: self._bulk_insert(p["project"], p["zone"], body)
        )

    def _bulk_insert(self, project: str, zone: str, body: Any) -> Any:
        if not isinstance(body, dict):
            raise ApiError(400, "Required field 'resource' not specified", "required")
        props = dict(body.get("instanceProperties") or {})
        if not props:
            raise ApiError(
                400, "Required field 'instanceProperties' not specified", "required"
            )
        names = list((body.get("perInstanceProperties") or {}).keys())
        count = int(body.get("count") or len(names))
        pattern = body.get("namePattern")
        with self._lock:
            taken = {n for (proj, z, n) in self._instances if proj == project and z == zone}
        if len(names) < count:
            if not pattern or "#" not in pattern:
                raise ApiError(
                    400, "namePattern with # is required when count exceeds the names given",
                    "invalid",
                )
            width = pattern.count("#")
            index = 1
            while len(names) < count:
                candidate = re.sub("#+", str(index).zfill(width), pattern)
                index += 1
                if candidate not in taken and candidate not in names:
                    names.append(candidate)
        # instanceProperties name bare types ("e2-standard-2"); an instance
        # names them by URL.
        if props.get("machineType") and "/" not in props["machineType"]:
            props["machineType"] = f"zones/{zone}/machineTypes/{props['machineType']}"
        for acc in props.get("guestAccelerators") or []:
            if "/" not in acc.get("acceleratorType", ""):
                acc["acceleratorType"] = f"zones/{zone}/acceleratorTypes/{acc['acceleratorType']}"
        resources = [
            instance_resource(project, zone, {**props, "name": n}, self._projects.networks)
            for n in names
        ]
        with self._lock:
            clash = [r["name"] for r in resources if (project, zone, r["name"]) in self._instances]
            if clash:
                raise ApiError(
                    409,
                    f"The resource 'projects/{project}/zones/{zone}/instances/{clash[0]}' "
                    "already exists",
                    "alreadyExists",
                )
            fate = self._faults.capacity_fate(project, zone, "bulkInsert")
            insts = [_Instance(project, zone, r["name"], r) for r in resources]
            for inst in insts:
                self._instances[(project, zone, inst.name)] = inst
            op = self._operations.new(
                project, f"zones/{zone}", "bulkInsert",
                {"selfLink": f"{API_ROOT}/projects/{project}/zones/{zone}/instances"},
            )
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            staged = threading.Semaphore(0)
            failures: list[BaseException] = []

            def one(inst: _Instance) -> None:
                try:
                    self._create(inst, fate, staged.release)
                except BaseException as exc:  # collected: the op fails with it
                    failures.append(exc)
                    staged.release()

            threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in insts]
            for thread in threads:
                thread.start()
            for _ in insts:
                staged.acquire()
            if failures:
                raise failures[0]

        self._operations.spawn(op, work)
        return answer

    def _internal_ip(self) -> str:
        with self._lock:
            n = self._next_internal
            self._next_internal += 1
        return str(ipaddress.ip_address("10.128.0.0") + n)

    def _give_nat(self, resource: dict[str, Any], nat_ip: str | None) -> None:
        """Attach an ephemeral external IP (new each time) to the access config."""
        for nic in resource["networkInterfaces"]:
            for access in nic.get("accessConfigs", []):
                if access.get("x-fake-static"):
                    access["natIP"] = access["x-fake-static"]
                    continue
                access["natIP"] = nat_ip or self._nat_ip()
                nat_ip = None  # only the first access config gets the backend's address

    def _drop_nat(self, resource: dict[str, Any]) -> None:
        for nic in resource["networkInterfaces"]:
            for access in nic.get("accessConfigs", []):
                if not access.get("x-fake-static"):
                    access.pop("natIP", None)

    def _nat_ip(self) -> str:
        with self._lock:
            used = {
                a.get("natIP")
                for i in self._instances.values()
                for nic in i.resource["networkInterfaces"]
                for a in nic.get("accessConfigs", [])
            }
            for _ in range(254):
                n = self._next_nat
                self._next_nat = self._next_nat % 254 + 1
                address = f"203.0.113.{n}"
                if address not in used:
                    return address
        raise ApiError(
            403, "Quota 'IN_USE_ADDRESSES' exceeded.  Limit: 254.0", "quotaExceeded",
            "usageLimits",
        )

    def _api_instances_delete(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        with self._lock:
            op = self._operations.new(inst.project, f"zones/{inst.zone}", "delete", inst.resource)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            with inst.op_lock:
                if inst.deleted:  # deleted while this operation waited its turn
                    raise OpFailure(
                        "RESOURCE_NOT_FOUND", f"The resource '{inst.name}' was not found", 404,
                        "NOT FOUND",
                    )
                with self._lock:
                    inst.resource["status"] = "STOPPING"
                self._world.sleep(self.latency.delete)
                with self._lock:
                    snapshot = copy.deepcopy(inst.resource)
                if inst.backend_created:
                    self.backend.on_delete(snapshot)
                with self._lock:
                    inst.deleted = True
                    self._instances.pop((inst.project, inst.zone, inst.name), None)

        self._operations.spawn(op, work)
        return answer

    def _api_instances_stop(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        discard = query.get("discardLocalSsd")
        with self._lock:
            scratch = [d for d in inst.resource["disks"] if d.get("type") == "SCRATCH"]
            if scratch and discard not in ("true", "false"):
                # Real GCE, word for word (400 badRequest; skypilot-org/skypilot#2586,
                # openshift/installer#8649).
                raise ApiError(
                    400,
                    "VM has a Local SSD attached but an undefined value for "
                    "`discard-local-ssd`. If using gcloud, please add "
                    "`--discard-local-ssd=false` or `--discard-local-ssd=true` to your command.",
                    "badRequest",
                )
            op = self._operations.new(inst.project, f"zones/{inst.zone}", "stop", inst.resource)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            with inst.op_lock:
                with self._lock:
                    if inst.deleted:
                        raise OpFailure(
                            "RESOURCE_NOT_FOUND", f"The resource '{inst.name}' was not found", 404,
                            "NOT FOUND",
                        )
                    if inst.resource["status"] == "TERMINATED":
                        return
                    inst.resource["status"] = "STOPPING"
                self._world.sleep(self.latency.stop)
                with self._lock:
                    snapshot = copy.deepcopy(inst.resource)
                self.backend.on_stop(snapshot)
                with self._lock:
                    inst.resource["status"] = "TERMINATED"
                    inst.resource["lastStopTimestamp"] = now()
                    self._drop_nat(inst.resource)
                    for disk in scratch:
                        # AttachedDisk.savedState: PRESERVED when the data was kept.
                        if discard == "false":
                            disk["savedState"] = "PRESERVED"
                        else:
                            disk.pop("savedState", None)

        self._operations.spawn(op, work)
        return answer

    def _api_instances_start(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        return self._start(p, "start")

    def _api_instances_resume(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        return self._start(p, "resume")

    def _start(self, p: dict[str, str], kind: str) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        with self._lock:
            status = inst.resource["status"]
            if status in ("STOPPING", "PENDING_STOP"):
                raise ApiError(
                    400,
                    f"The resource 'projects/{inst.project}/zones/{inst.zone}/instances/"
                    f"{inst.name}' is not ready",
                    "resourceNotReady",
                )
            if kind == "start" and status in ("SUSPENDED", "SUSPENDING"):
                raise ApiError(
                    400,
                    f"Instance '{inst.name}' is suspended; resume it instead of starting it.",
                    "invalid",
                )
            if kind == "resume" and status not in ("SUSPENDED", "RUNNING"):
                raise ApiError(
                    400, f"Instance '{inst.name}' is not suspended (it is {status}).", "invalid"
                )
            op = self._operations.new(inst.project, f"zones/{inst.zone}", kind, inst.resource)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            with inst.op_lock:
                with self._lock:
                    if inst.deleted:
                        raise OpFailure(
                            "RESOURCE_NOT_FOUND", f"The resource '{inst.name}' was not found", 404,
                            "NOT FOUND",
                        )
                    if inst.resource["status"] == "RUNNING":
                        return
                fate = self._faults.capacity_fate(inst.project, inst.zone, "start")
                if fate is not None:
                    self._world.sleep(self.latency.start)
                    raise fate[0]
                with self._lock:
                    inst.resource["status"] = "STAGING"
                    snapshot = copy.deepcopy(inst.resource)
                addresses = self.backend.on_start(snapshot)
                with self._lock:
                    if addresses.network_ip:
                        inst.resource["networkInterfaces"][0]["networkIP"] = addresses.network_ip
                    self._give_nat(inst.resource, addresses.nat_ip)
                self._world.sleep(self.latency.start)
                with self._lock:
                    if inst.resource["status"] == "STAGING":
                        inst.resource["status"] = "RUNNING"
                        inst.resource["lastStartTimestamp"] = now()
                        inst.running_since = time.monotonic()
                        for disk in inst.resource["disks"]:
                            disk.pop("savedState", None)  # the data is back on the disks

        self._operations.spawn(op, work)
        return answer

    def _api_instances_setLabels(
        self, call: Call, p: dict[str, str], query: dict[str, str], body: Any
    ) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        body = body or {}
        labels = dict(body.get("labels") or {})
        check_labels(labels)
        with self._lock:
            if body.get("labelFingerprint") != inst.resource["labelFingerprint"]:
                raise ApiError(
                    412,
                    "Labels fingerprint either invalid or resource labels have changed",
                    "conditionNotMet",
                )
            inst.resource["labels"] = labels
            inst.resource["labelFingerprint"] = fingerprint(labels)
            op = self._operations.new(inst.project, f"zones/{inst.zone}", "setLabels",
                                     inst.resource)
            answer = copy.deepcopy(op.resource)
        self._operations.spawn(op, lambda: self._world.sleep(self.latency.metadata))
        return answer

    def _api_instances_setMetadata(
        self, call: Call, p: dict[str, str], query: dict[str, str], body: Any
    ) -> Any:
        inst = self._instance(p["project"], p["zone"], p["name"])
        body = body or {}
        items = list(body.get("items") or [])
        keys = [item.get("key") for item in items]
        if len(set(keys)) != len(keys):
            raise ApiError(400, "Duplicate metadata key", "invalid")
        with self._lock:
            if body.get("fingerprint") != inst.resource["metadata"]["fingerprint"]:
                raise ApiError(
                    412,
                    "Supplied fingerprint does not match current metadata fingerprint.",
                    "conditionNotMet",
                )
            inst.resource["metadata"] = {
                "kind": "compute#metadata",
                "fingerprint": fingerprint(items),
                "items": items,
            }
            snapshot = copy.deepcopy(inst.resource)
            op = self._operations.new(inst.project, f"zones/{inst.zone}", "setMetadata",
                                     inst.resource)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            self._world.sleep(self.latency.metadata)
            self.backend.on_metadata(snapshot)

        self._operations.spawn(op, work)
        return answer


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
