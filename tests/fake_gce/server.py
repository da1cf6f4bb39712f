"""A fake Compute Engine v1 REST API that the real google-cloud-compute client talks to.

``FakeGce`` is a ``ThreadingHTTPServer`` on a loopback port that speaks the
JSON of the real API: instances (insert, bulkInsert, get, list,
aggregatedList, start, stop, resume, delete, setLabels, setMetadata,
getGuestAttributes), firewalls (insert, get, list, patch, update, delete),
images, networks and projects (get), and zone/global operations (get,
wait). Point a client at it with ``ClientOptions(api_endpoint=fake.endpoint)``
and ``AnonymousCredentials()``.

``FakeGce`` is the facade tests hold; each resource is a part of its own,
in a module that says what it models:

* front.py        routes, request parsing, the call log, errors as GCE writes them
* operations.py   Operations: RUNNING at once, DONE when the work is; ``wait``
* instances.py    the instance table; get, list, aggregatedList, setLabels, setMetadata
* inserts.py      insert, bulkInsert: PROVISIONING -> STAGING -> RUNNING
* instance_body.py  an insert body checked as GCE checks it; the stored resource
* lifecycle.py    stop, start, resume, delete; preemption and the like outside the API
* addresses.py    networkIP at create; an ephemeral natIP while it runs
* guest.py        guest attributes (the host keys the guest agent publishes)
* firewalls.py    firewall rules, their checks, GCE's default rules, ``reachable``
* projects.py     networks, project metadata, images, projects.get
* faults.py       injected faults: HTTP errors, stockouts, quota, hooks
* catalog.py, identity.py, filters.py  what is offered, who runs, list filters
* backend.py      what an instance *is* (``InstanceBackend``; docker_backend.py)
* world.py        what the parts share: the lock, ``Latency``, the backend

Faults are injected per call (``fail``, ``stockout``, ``quota_exceeded``,
``hook``) and by hand (``preempt``, ``suspend``, ``remove_instance``...).
Every request is in ``calls`` for assertions such as "a dry run made no
mutating call".
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from http.server import ThreadingHTTPServer
from typing import Any

from tests.fake_gce.addresses import AddressPool
from tests.fake_gce.api import Call
from tests.fake_gce.backend import InstanceBackend
from tests.fake_gce.faults import Faults
from tests.fake_gce.firewalls import Firewalls
from tests.fake_gce.front import Front
from tests.fake_gce.guest import GuestAttributes
from tests.fake_gce.inserts import Inserts
from tests.fake_gce.instances import Instances
from tests.fake_gce.lifecycle import Lifecycle
from tests.fake_gce.operations import Operations
from tests.fake_gce.projects import Projects
from tests.fake_gce.world import DEFAULT_ZONES, Latency, World


class FakeGce:
    """The fake Compute API on a loopback port (``start`` or ``with``; then
    ``endpoint``). What a test may do to it or ask of it is here; each
    method hands over to the part that owns the resource."""

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
        world = World(latency or Latency(), backend or InstanceBackend(), zones, wait_max_s)
        self._world = world
        self._host = host
        self._port = port
        self._operations = Operations(world)
        self._faults = Faults(world)
        # Each needs the other: a new project gets the default rules, a rule
        # is checked against its project's networks.
        self._rules = Firewalls(world, self._operations, lambda p: self._projects.networks(p))
        self._projects = Projects(world, on_new=self._rules.add_defaults)
        self._instances = Instances(world, self._operations)
        addresses = AddressPool(world, self._instances.nat_ips)
        self._inserts = Inserts(
            world, self._instances, self._operations, self._faults, addresses,
            self._projects.networks,
        )
        self._lifecycle = Lifecycle(
            world, self._instances, self._operations, self._faults, addresses
        )
        self._guest = GuestAttributes(world, self._instances)
        parts = (self._operations, self._rules, self._projects, self._instances,
                 self._inserts, self._lifecycle, self._guest)
        handlers = {op: fn for part in parts for op, fn in part.handlers().items()}
        self._front = Front(world, self._faults, handlers, self._projects.networks)
        self._server: ThreadingHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None

    # -- lifetime -------------------------------------------------------------------

    def start(self) -> FakeGce:
        server = self._front.listen(self._host, self._port)
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
    def project_metadata(self) -> dict[str, dict[str, str]]:
        """Project -> its commonInstanceMetadata (key -> value), as projects.get shows it."""
        return self._projects.metadata

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
        """The instance is SUSPENDED (as ``instances.suspend`` leaves it)."""
        self._lifecycle.suspend(name, zone)

    def remove_instance(self, name: str, zone: str | None = None) -> None:
        """Someone deleted the instance in the console: gone at once."""
        self._lifecycle.remove_instance(name, zone)

    def pending_stop(self, name: str, zone: str | None = None) -> None:
        """A stop waiting for the guest: see ``Lifecycle.pending_stop``."""
        self._lifecycle.pending_stop(name, zone)

    def set_guest_attribute(
        self, name: str, path: str, value: str | None, zone: str | None = None
    ) -> None:
        """Publish ``path`` as the guest would: see ``GuestAttributes.set``."""
        self._guest.set(name, path, value, zone)

    def add_network(
        self, name: str, subnets: Mapping[str, Sequence[str]], *, project: str = "fake-project",
        auto: bool = False,
    ) -> None:
        """A VPC network: see ``Projects.add_network``."""
        self._projects.add_network(name, subnets, project=project, auto=auto)

    # -- inspection -----------------------------------------------------------------

    def instances(self) -> list[dict[str, Any]]:
        return self._instances.resources()

    def instance(self, name: str, zone: str | None = None) -> dict[str, Any]:
        return self._instances.resource(name, zone)

    def firewalls(self, *, defaults: bool = False) -> list[dict[str, Any]]:
        """The firewall rules; GCE's own default-allow-* only with ``defaults``."""
        return self._rules.resources(defaults=defaults)

    def firewall(self, name: str) -> dict[str, Any] | None:
        return self._rules.find(name)

    def reachable(
        self, name: str, port: int, *, source_ip: str | None = None, source: str | None = None
    ) -> bool:
        """Whether a TCP connection to ``port`` of instance ``name`` gets
        through the firewall rules: from the address ``source_ip`` (outside),
        or from the instance ``source`` (its internal IP and network tags)."""
        target = self.instance(name)
        other = self.instance(source) if source is not None else None
        return self._rules.reachable(target, port, source_ip=source_ip, source=other)

    def operations(self) -> list[dict[str, Any]]:
        return self._operations.resources()

    @property
    def calls(self) -> list[Call]:
        """Every request, in order (front.py)."""
        return self._front.calls

    @property
    def internal_errors(self) -> list[BaseException]:
        """Failures of operation threads that are no modelled API behaviour."""
        return self._world.internal_errors

    def mutating_calls(self) -> list[Call]:
        return self._front.mutating_calls()

    def ops_called(self) -> list[str]:
        return self._front.ops_called()

    def reset_calls(self) -> None:
        self._front.reset_calls()

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until no mutating request is being answered (``Front.wait_idle``)."""
        self._front.wait_idle(timeout)

    def wait_quiet(self, timeout: float = 10.0) -> None:
        """Until no operation is running (all DONE)."""
        self._operations.wait_quiet(timeout)

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        authorization: str | None,
    ) -> tuple[int, Any]:
        """(HTTP status, JSON answer) of one request, as the server answers it."""
        return self._front.handle(method, path, query, body, authorization)

    # -- what tests reach into --------------------------------------------------------

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


def running_names(fake: FakeGce, statuses: Iterable[str] = ("RUNNING",)) -> list[str]:
    """Names of the fake's instances in one of ``statuses``, sorted."""
    wanted = set(statuses)
    return sorted(i["name"] for i in fake.instances() if i["status"] in wanted)
