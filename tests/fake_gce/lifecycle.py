"""An instance's states after its creation in the fake GCE: the API that
moves them (``instances.stop``: STOPPING -> TERMINATED, ``start`` and
``resume``: STAGING -> RUNNING, ``delete``: STOPPING -> gone; each with its
``Latency``, one after another per instance as GCE serialises them), and
what happens to an instance outside the API: preemption, a shutdown inside
the guest, suspension, a stop waiting for the guest (PENDING_STOP),
deletion in the console.

Machine types that come with Local SSD refuse ``stop`` without
``discardLocalSsd``, as GCE does; the disks' ``savedState`` says whether the
data was kept.
"""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

from tests.fake_gce.addresses import AddressPool
from tests.fake_gce.api import ApiError, Call, Handler, OpFailure, now
from tests.fake_gce.faults import Faults
from tests.fake_gce.instances import Instance, Instances
from tests.fake_gce.operations import Operations
from tests.fake_gce.world import Closing, World


class Lifecycle:
    def __init__(
        self,
        world: World,
        instances: Instances,
        operations: Operations,
        faults: Faults,
        addresses: AddressPool,
    ) -> None:
        self._world = world
        self._instances = instances
        self._operations = operations
        self._faults = faults
        self._addresses = addresses

    def handlers(self) -> dict[str, Handler]:
        return {
            "instances.delete": self._delete,
            "instances.stop": self._stop,
            "instances.start": self._start,
            "instances.resume": self._resume,
        }

    # -- the API ----------------------------------------------------------------------

    def _delete(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        world = self._world
        inst = self._instances.lookup(p["project"], p["zone"], p["name"])
        with world.lock:
            op = self._operations.new(
                inst.project, f"zones/{inst.zone}", "delete", inst.resource
            )
            answer = copy.deepcopy(op.resource)
            ticket = inst.ops.ticket()

        def work() -> None:
            with inst.ops.turn(ticket, world.closing):
                if inst.deleted:  # deleted while this operation waited its turn
                    raise _gone(inst)
                with world.lock:
                    inst.resource["status"] = "STOPPING"
                world.sleep(world.latency.delete)
                with world.lock:
                    snapshot = copy.deepcopy(inst.resource)
                if inst.backend_created:
                    world.backend.on_delete(snapshot)
                self._instances.discard(inst)

        self._operations.spawn(op, work)
        return answer

    def _stop(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        world = self._world
        inst = self._instances.lookup(p["project"], p["zone"], p["name"])
        discard = query.get("discardLocalSsd")
        with world.lock:
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
            ticket = inst.ops.ticket()

        def work() -> None:
            with inst.ops.turn(ticket, world.closing):
                with world.lock:
                    if inst.deleted:
                        raise _gone(inst)
                    if inst.resource["status"] == "TERMINATED":
                        return
                    inst.resource["status"] = "STOPPING"
                world.sleep(world.latency.stop)
                with world.lock:
                    snapshot = copy.deepcopy(inst.resource)
                world.backend.on_stop(snapshot)
                with world.lock:
                    inst.resource["status"] = "TERMINATED"
                    inst.resource["lastStopTimestamp"] = now()
                    self._addresses.drop_nat(inst.resource)
                    for disk in scratch:
                        # AttachedDisk.savedState: PRESERVED when the data was kept.
                        if discard == "false":
                            disk["savedState"] = "PRESERVED"
                        else:
                            disk.pop("savedState", None)

        self._operations.spawn(op, work)
        return answer

    def _start(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        return self._power_on(p, "start")

    def _resume(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        return self._power_on(p, "resume")

    def _power_on(self, p: dict[str, str], kind: str) -> Any:
        """``start`` (a stopped instance) or ``resume`` (a suspended one)."""
        inst = self._instances.lookup(p["project"], p["zone"], p["name"])
        with self._world.lock:
            _check_startable(inst, kind)
            op = self._operations.new(inst.project, f"zones/{inst.zone}", kind, inst.resource)
            answer = copy.deepcopy(op.resource)
            ticket = inst.ops.ticket()
        self._operations.spawn(op, lambda: self._run(inst, ticket))
        return answer

    def _run(self, inst: Instance, ticket: int) -> None:
        """STAGING -> RUNNING with new addresses, or the zone's stockout."""
        world = self._world
        with inst.ops.turn(ticket, world.closing):
            with world.lock:
                if inst.deleted:
                    raise _gone(inst)
                if inst.resource["status"] == "RUNNING":
                    return
            fate = self._faults.capacity_fate(inst.project, inst.zone, "start")
            if fate is not None:
                world.sleep(world.latency.start)
                raise fate[0]
            with world.lock:
                inst.resource["status"] = "STAGING"
                snapshot = copy.deepcopy(inst.resource)
            addresses = world.backend.on_start(snapshot)
            with world.lock:
                if addresses.network_ip:
                    inst.resource["networkInterfaces"][0]["networkIP"] = addresses.network_ip
                self._addresses.give_nat(inst.resource, addresses.nat_ip)
            world.sleep(world.latency.start)
            with world.lock:
                if inst.resource["status"] == "STAGING":
                    inst.resource["status"] = "RUNNING"
                    inst.resource["lastStartTimestamp"] = now()
                    inst.running_since = time.monotonic()
                    for disk in inst.resource["disks"]:
                        disk.pop("savedState", None)  # the data is back on the disks

    # -- outside the API ----------------------------------------------------------------

    def preempt(self, name: str, zone: str | None = None) -> None:
        """GCE reclaims a Spot VM: TERMINATED at once, external IP gone, and a
        ``compute.instances.preempted`` operation in the zone."""
        inst = self._instances.find(name, zone)
        with self._world.lock:
            res = inst.resource
            res["status"] = "TERMINATED"
            res["lastStopTimestamp"] = now()
            self._addresses.drop_nat(res)
            snapshot = copy.deepcopy(res)
            op = self._operations.new(
                inst.project, f"zones/{inst.zone}", "compute.instances.preempted", res
            )
        self._world.backend.on_stop(snapshot)
        self._operations.finish(op)

    def guest_shutdown(self, name: str, zone: str | None = None) -> bool:
        """The guest powered itself off (``shutdown -h now`` inside it): GCE
        makes the instance TERMINATED (disks kept, external IP gone) and
        records a ``compute.instances.guestTerminate`` operation. False
        when it was not RUNNING: a stop, delete or preemption of the API
        had stopped the guest."""
        try:
            inst = self._instances.find(name, zone)
        except KeyError:
            return False
        with self._world.lock:
            res = inst.resource
            if inst.deleted or res["status"] != "RUNNING":
                return False
            res["status"] = "TERMINATED"
            res["lastStopTimestamp"] = now()
            self._addresses.drop_nat(res)
            op = self._operations.new(
                inst.project, f"zones/{inst.zone}", "compute.instances.guestTerminate", res
            )
        self._operations.finish(op)
        return True

    def suspend(self, name: str, zone: str | None = None) -> None:
        """The instance is SUSPENDED (as ``instances.suspend`` leaves it)."""
        inst = self._instances.find(name, zone)
        with self._world.lock:
            inst.resource["status"] = "SUSPENDED"
            self._addresses.drop_nat(inst.resource)
            snapshot = copy.deepcopy(inst.resource)
        self._world.backend.on_stop(snapshot)

    def remove_instance(self, name: str, zone: str | None = None) -> None:
        """Someone deleted the instance in the console: gone at once."""
        inst = self._instances.find(name, zone)
        with self._world.lock:
            self._instances.discard(inst)
            snapshot = copy.deepcopy(inst.resource)
        if inst.backend_created:
            self._world.backend.on_delete(snapshot)

    def pending_stop(self, name: str, zone: str | None = None) -> None:
        """A stop waiting for the guest to shut down: PENDING_STOP, then
        TERMINATED after ``latency.stop``; GCE refuses to start it meanwhile."""
        world = self._world
        inst = self._instances.find(name, zone)
        with world.lock:
            inst.resource["status"] = "PENDING_STOP"

        def later() -> None:
            try:
                world.sleep(world.latency.stop)
            except Closing:
                return
            with world.lock:
                snapshot = copy.deepcopy(inst.resource)
            world.backend.on_stop(snapshot)
            with world.lock:
                if inst.resource["status"] == "PENDING_STOP":
                    inst.resource["status"] = "TERMINATED"
                    inst.resource["lastStopTimestamp"] = now()
                    self._addresses.drop_nat(inst.resource)

        threading.Thread(target=later, daemon=True, name=f"pending-stop-{name}").start()


def _check_startable(inst: Instance, kind: str) -> None:
    """GCE's 400 for a start or resume the instance's state refuses."""
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


def _gone(inst: Instance) -> OpFailure:
    """How an operation ends whose instance was deleted while it waited."""
    return OpFailure(
        "RESOURCE_NOT_FOUND", f"The resource '{inst.name}' was not found", 404, "NOT FOUND"
    )
