"""Instances of the fake GCE: the table of them, and the API that reads
them (``instances.get``, ``list``, ``aggregatedList``, filters by
filters.py) or changes what they carry (``setLabels``, ``setMetadata``, each
checked against its fingerprint: 412 conditionNotMet when stale).

Creating them is inserts.py's, their states after that lifecycle.py's,
their guest attributes guest.py's; the body checks instance_body.py's.
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tests.fake_gce.api import API_ROOT, ApiError, Call, Handler, fingerprint, not_found, page
from tests.fake_gce.filters import compile_filter
from tests.fake_gce.instance_body import check_labels
from tests.fake_gce.operations import Operations
from tests.fake_gce.world import Closing, World


class OpQueue:
    """Operations on one instance run one at a time, in the order the API
    accepted them, as GCE queues them. A plain lock would not do: it wakes its
    waiters in any order, so a delete accepted second could run first (and the
    first then fail "not found"). Each operation takes a ticket when accepted
    (on the request's thread) and waits for its turn on its own. The first
    ticket, ``CREATE``, is the insert's: no other call finds the instance
    before it is inserted."""

    CREATE = 0

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._issued = self.CREATE + 1
        self._serving = self.CREATE

    def ticket(self) -> int:
        with self._cond:
            self._issued += 1
            return self._issued - 1

    @contextmanager
    def turn(self, ticket: int, closing: threading.Event) -> Iterator[None]:
        """Wait until the operations accepted before ``ticket`` are done;
        ``Closing`` if the fake stops meanwhile."""
        with self._cond:
            while self._serving != ticket:
                if closing.is_set():
                    raise Closing
                self._cond.wait(0.05)
        try:
            yield
        finally:
            with self._cond:
                self._serving += 1
                self._cond.notify_all()


@dataclass
class Instance:
    project: str
    zone: str
    name: str
    resource: dict[str, Any]
    ops: OpQueue = field(default_factory=OpQueue)
    deleted: bool = False
    backend_created: bool = False
    running_since: float | None = None  # monotonic time it last became RUNNING
    # Set by tests (``set_guest_attribute``): path -> value, over the backend's.
    guest_attributes: dict[str, str] = field(default_factory=dict)


class Instances:
    def __init__(self, world: World, operations: Operations) -> None:
        self._world = world
        self._operations = operations
        self._instances: dict[tuple[str, str, str], Instance] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "instances.get": self._get,
            "instances.list": self._list,
            "instances.aggregatedList": self._aggregated_list,
            "instances.setLabels": self._set_labels,
            "instances.setMetadata": self._set_metadata,
        }

    # -- the table ------------------------------------------------------------------

    def lookup(self, project: str, zone: str, name: str) -> Instance:
        """The instance a request names; 404 as GCE answers."""
        with self._world.lock:
            inst = self._instances.get((project, zone, name))
        if inst is None:
            raise not_found(f"projects/{project}/zones/{zone}/instances/{name}")
        return inst

    def find(self, name: str, zone: str | None) -> Instance:
        """The one instance of this name (in ``zone``), for a test's hand."""
        with self._world.lock:
            found = [
                i
                for (_, z, n), i in self._instances.items()
                if n == name and (zone is None or z == zone)
            ]
        if len(found) != 1:
            raise KeyError(f"{len(found)} instances named {name} (zone {zone})")
        return found[0]

    def exists(self, project: str, zone: str, name: str) -> bool:
        with self._world.lock:
            return (project, zone, name) in self._instances

    def names(self, project: str, zone: str) -> set[str]:
        with self._world.lock:
            return {n for (proj, z, n) in self._instances if proj == project and z == zone}

    def add(self, inst: Instance) -> None:
        with self._world.lock:
            self._instances[(inst.project, inst.zone, inst.name)] = inst

    def discard(self, inst: Instance) -> None:
        """The instance is gone (deleted, or never made it)."""
        with self._world.lock:
            inst.deleted = True
            self._instances.pop((inst.project, inst.zone, inst.name), None)

    def nat_ips(self) -> set[str | None]:
        """The external addresses the instances hold now."""
        with self._world.lock:
            return {
                a.get("natIP")
                for i in self._instances.values()
                for nic in i.resource["networkInterfaces"]
                for a in nic.get("accessConfigs", [])
            }

    # -- inspection -------------------------------------------------------------------

    def resources(self) -> list[dict[str, Any]]:
        with self._world.lock:
            return [
                copy.deepcopy(i.resource)
                for _, i in sorted(self._instances.items(), key=lambda kv: kv[0])
            ]

    def resource(self, name: str, zone: str | None = None) -> dict[str, Any]:
        inst = self.find(name, zone)
        with self._world.lock:
            return copy.deepcopy(inst.resource)

    # -- the API: reading -------------------------------------------------------------

    def _get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        inst = self.lookup(p["project"], p["zone"], p["name"])
        with self._world.lock:
            return copy.deepcopy(inst.resource)

    def _list(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        match = compile_filter(query.get("filter"))
        with self._world.lock:
            items = [
                copy.deepcopy(i.resource)
                for (proj, zone, _), i in sorted(self._instances.items())
                if proj == p["project"] and zone == p["zone"] and match(i.resource)
            ]
        base = f"projects/{p['project']}/zones/{p['zone']}/instances"
        return page("compute#instanceList", base, items, query)

    def _aggregated_list(
        self, call: Call, p: dict[str, str], query: dict[str, str], b: Any
    ) -> Any:
        match = compile_filter(query.get("filter"))
        project = p["project"]
        with self._world.lock:
            by_zone: dict[str, list[dict[str, Any]]] = {zone: [] for zone in self._world.zones}
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

    # -- the API: labels and metadata -------------------------------------------------

    def _set_labels(self, call: Call, p: dict[str, str], query: dict[str, str], body: Any) -> Any:
        inst = self.lookup(p["project"], p["zone"], p["name"])
        body = body or {}
        labels = dict(body.get("labels") or {})
        check_labels(labels)
        with self._world.lock:
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
        self._operations.spawn(op, lambda: self._world.sleep(self._world.latency.metadata))
        return answer

    def _set_metadata(
        self, call: Call, p: dict[str, str], query: dict[str, str], body: Any
    ) -> Any:
        inst = self.lookup(p["project"], p["zone"], p["name"])
        body = body or {}
        items = list(body.get("items") or [])
        keys = [item.get("key") for item in items]
        if len(set(keys)) != len(keys):
            raise ApiError(400, "Duplicate metadata key", "invalid")
        with self._world.lock:
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
            self._world.sleep(self._world.latency.metadata)
            self._world.backend.on_metadata(snapshot)

        self._operations.spawn(op, work)
        return answer
