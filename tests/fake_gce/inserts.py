"""Creating instances in the fake GCE: ``instances.insert`` and
``instances.bulkInsert`` (names given, or made from a ``namePattern``), and
the life of a new instance: PROVISIONING -> STAGING -> RUNNING, each with
its ``Latency``; the insert operation is DONE at STAGING, so a client must
still wait for RUNNING. A stockout or quota planted in faults.py ends the
operation with its error: the instance shows up PROVISIONING and vanishes
(or stays TERMINATED, ``leave_instance``).
"""

from __future__ import annotations

import copy
import re
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from tests.fake_gce.addresses import AddressPool
from tests.fake_gce.api import API_ROOT, ApiError, Call, Handler, OpFailure, now
from tests.fake_gce.faults import Faults
from tests.fake_gce.instance_body import Networks, instance_resource
from tests.fake_gce.instances import Instance, Instances, OpQueue
from tests.fake_gce.operations import Operations
from tests.fake_gce.world import World

# What a stockout or quota does to a create: (the operation's error, leave
# a half-created TERMINATED instance); None: it goes well.
Fate = tuple[OpFailure, bool] | None


class Inserts:
    def __init__(
        self,
        world: World,
        instances: Instances,
        operations: Operations,
        faults: Faults,
        addresses: AddressPool,
        networks: Networks,
    ) -> None:
        self._world = world
        self._instances = instances
        self._operations = operations
        self._faults = faults
        self._addresses = addresses
        self._networks = networks

    def handlers(self) -> dict[str, Handler]:
        return {"instances.insert": self._insert, "instances.bulkInsert": self._bulk_insert}

    def _insert(self, call: Call, p: dict[str, str], query: dict[str, str], body: Any) -> Any:
        return self._operations.dedup(query, lambda: self.insert(p["project"], p["zone"], body))

    def insert(self, project: str, zone: str, body: Any) -> Any:
        """One instance from ``body``; the insert operation, as the API answers."""
        resource = instance_resource(project, zone, body, self._networks)
        with self._world.lock:
            if self._instances.exists(project, zone, resource["name"]):
                raise _exists(project, zone, resource["name"])
            fate = self._faults.capacity_fate(project, zone, "insert")
            inst = Instance(project, zone, resource["name"], resource)
            self._instances.add(inst)
            op = self._operations.new(project, f"zones/{zone}", "insert", resource)
            answer = copy.deepcopy(op.resource)
        self._operations.spawn(
            op, lambda: self._create(inst, fate, lambda: self._operations.finish(op))
        )
        return answer

    def _bulk_insert(
        self, call: Call, p: dict[str, str], query: dict[str, str], body: Any
    ) -> Any:
        return self._operations.dedup(
            query, lambda: self.bulk_insert(p["project"], p["zone"], body)
        )

    def bulk_insert(self, project: str, zone: str, body: Any) -> Any:
        """The instances of a bulkInsert body; one operation for them all,
        DONE when every one is STAGING (or failed)."""
        if not isinstance(body, dict):
            raise ApiError(400, "Required field 'resource' not specified", "required")
        props = dict(body.get("instanceProperties") or {})
        if not props:
            raise ApiError(
                400, "Required field 'instanceProperties' not specified", "required"
            )
        names = self._bulk_names(project, zone, body)
        _types_by_url(zone, props)
        resources = [
            instance_resource(project, zone, {**props, "name": n}, self._networks)
            for n in names
        ]
        with self._world.lock:
            clash = [r["name"] for r in resources
                     if self._instances.exists(project, zone, r["name"])]
            if clash:
                raise _exists(project, zone, clash[0])
            fate = self._faults.capacity_fate(project, zone, "bulkInsert")
            insts = [Instance(project, zone, r["name"], r) for r in resources]
            for inst in insts:
                self._instances.add(inst)
            op = self._operations.new(
                project, f"zones/{zone}", "bulkInsert",
                {"selfLink": f"{API_ROOT}/projects/{project}/zones/{zone}/instances"},
            )
            answer = copy.deepcopy(op.resource)
        self._operations.spawn(op, lambda: self._create_all(insts, fate))
        return answer

    def _bulk_names(self, project: str, zone: str, body: dict[str, Any]) -> list[str]:
        """The names given, then names from ``namePattern`` (its ``#``s a
        number) not yet taken, up to ``count``."""
        names = list((body.get("perInstanceProperties") or {}).keys())
        count = int(body.get("count") or len(names))
        pattern = body.get("namePattern")
        taken = self._instances.names(project, zone)
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
        return names

    def _create_all(self, insts: list[Instance], fate: Fate) -> None:
        """Create ``insts`` at once; returns when each is STAGING or failed,
        raising the first failure."""
        staged = threading.Semaphore(0)
        failures: list[BaseException] = []

        def one(inst: Instance) -> None:
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

    def _create(self, inst: Instance, fate: Fate, on_staged: Callable[[], None]) -> None:
        """PROVISIONING -> STAGING (``on_staged``) -> RUNNING, or a stockout."""
        world = self._world
        with inst.ops.turn(OpQueue.CREATE, world.closing):
            if fate is not None:
                self._fail_create(inst, fate)
            with world.lock:
                snapshot = copy.deepcopy(inst.resource)
            addresses = world.backend.on_create(snapshot)
            inst.backend_created = True
            with world.lock:
                nic = inst.resource["networkInterfaces"][0]
                nic["networkIP"] = addresses.network_ip or self._addresses.internal_ip()
            world.sleep(world.latency.provision_of(inst.name))
            with world.lock:
                if inst.deleted or inst.resource["status"] != "PROVISIONING":
                    on_staged()
                    return
                inst.resource["status"] = "STAGING"
                self._addresses.give_nat(inst.resource, addresses.nat_ip)
            on_staged()
            world.sleep(world.latency.staging)
            with world.lock:
                if not inst.deleted and inst.resource["status"] == "STAGING":
                    inst.resource["status"] = "RUNNING"
                    inst.resource["lastStartTimestamp"] = now()
                    inst.running_since = time.monotonic()

    def _fail_create(self, inst: Instance, fate: tuple[OpFailure, bool]) -> NoReturn:
        """A create that meets a stockout: PROVISIONING for a while, then
        gone (or TERMINATED); raises the operation's error."""
        failure, leave = fate
        self._world.sleep(self._world.latency.provision_of(inst.name))
        with self._world.lock:
            if leave:
                inst.resource["status"] = "TERMINATED"
            else:
                self._instances.discard(inst)
        raise failure


def _types_by_url(zone: str, props: dict[str, Any]) -> None:
    """instanceProperties name bare types ("e2-standard-2"); an instance
    names them by URL."""
    if props.get("machineType") and "/" not in props["machineType"]:
        props["machineType"] = f"zones/{zone}/machineTypes/{props['machineType']}"
    for acc in props.get("guestAccelerators") or []:
        if "/" not in acc.get("acceleratorType", ""):
            acc["acceleratorType"] = f"zones/{zone}/acceleratorTypes/{acc['acceleratorType']}"


def _exists(project: str, zone: str, name: str) -> ApiError:
    return ApiError(
        409,
        f"The resource 'projects/{project}/zones/{zone}/instances/{name}' already exists",
        "alreadyExists",
    )
