"""Operations of the fake GCE: zone and global Operation resources, their
life and the API that reads them (``zoneOperations.get/wait``,
``globalOperations.get/wait``).

A mutating call answers 200 with an Operation (status RUNNING) at once; the
work happens on a thread of its own (``spawn``) and the Operation becomes
DONE, with ``error.errors[].code`` and ``httpErrorStatusCode`` when it
failed (``OpFailure``: a stockout, quota). ``wait`` blocks until DONE or
``wait_max_s``, as the real one does for up to 2 minutes. A retried call
with the same ``requestId`` gets the first call's Operation (``dedup``).
"""

from __future__ import annotations

import copy
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tests.fake_gce.api import (
    API_ROOT,
    Call,
    Handler,
    OpFailure,
    not_found,
    now,
    resource_id,
)
from tests.fake_gce.world import Closing, World


@dataclass
class Operation:
    project: str
    scope: str  # "zones/<zone>" or "global"
    resource: dict[str, Any]
    done: threading.Event = field(default_factory=threading.Event)


class Operations:
    def __init__(self, world: World) -> None:
        self._world = world
        self._operations: dict[tuple[str, str, str], Operation] = {}
        self._request_ids: dict[str, dict[str, Any]] = {}
        self._threads: list[threading.Thread] = []

    def handlers(self) -> dict[str, Handler]:
        return {
            "zoneOperations.get": self._zone_get,
            "zoneOperations.wait": self._zone_wait,
            "globalOperations.get": self._global_get,
            "globalOperations.wait": self._global_wait,
        }

    # -- life of an operation ---------------------------------------------------------

    def new(
        self, project: str, scope: str, op_type: str, target: Mapping[str, Any]
    ) -> Operation:
        name = f"operation-{int(time.time() * 1000)}-{secrets.token_hex(6)}-{secrets.token_hex(4)}"
        resource: dict[str, Any] = {
            "kind": "compute#operation",
            "id": resource_id(),
            "name": name,
            "operationType": op_type,
            "targetLink": target.get("selfLink", ""),
            "status": "RUNNING",
            "user": "fake@tfcluster.invalid",
            "progress": 0,
            "insertTime": now(),
            "startTime": now(),
            "selfLink": f"{API_ROOT}/projects/{project}/{scope}/operations/{name}",
        }
        if target.get("id"):
            resource["targetId"] = target["id"]
        if scope.startswith("zones/"):
            resource["zone"] = f"{API_ROOT}/projects/{project}/{scope}"
        op = Operation(project, scope, resource)
        with self._world.lock:
            self._operations[(project, scope, name)] = op
        return op

    def finish(self, op: Operation, failure: OpFailure | None = None) -> None:
        with self._world.lock:
            if op.done.is_set():
                return
            res = op.resource
            res["status"] = "DONE"
            res["progress"] = 100
            res["endTime"] = now()
            if failure is not None:
                res["error"] = {"errors": [{"code": failure.code, "message": failure.message}]}
                res["httpErrorStatusCode"] = failure.http_status
                res["httpErrorMessage"] = failure.http_message
            op.done.set()

    def spawn(self, op: Operation, work: Callable[[], None]) -> None:
        """Run ``work`` for ``op`` on its own thread; the op is DONE when work
        returns (or earlier, if work finishes it), failed if it raises."""

        def run() -> None:
            try:
                work()
            except Closing:
                return
            except OpFailure as failure:
                self.finish(op, failure)
                return
            except BaseException as exc:  # recorded; the fixture fails the test
                self._world.internal_errors.append(exc)
                self.finish(op, OpFailure("INTERNAL_ERROR", f"fake: {exc!r}", 500, "INTERNAL"))
                return
            self.finish(op)

        thread = threading.Thread(target=run, daemon=True, name=f"op-{op.resource['name']}")
        with self._world.lock:
            self._threads = [t for t in self._threads if t.is_alive()]
            self._threads.append(thread)
            thread.start()  # under the lock: stop() never sees an unstarted thread

    def join(self, timeout: float) -> None:
        """Wait for the operation threads (the fake is stopping)."""
        for thread in list(self._threads):
            thread.join(timeout=timeout)

    def dedup(self, query: Mapping[str, str], make: Callable[[], Any]) -> Any:
        """``requestId``: a retried mutating call gets the first one's operation."""
        request_id = query.get("requestId")
        if not request_id:
            return make()
        with self._world.lock:
            if request_id in self._request_ids:
                return copy.deepcopy(self._request_ids[request_id])
        result = make()
        with self._world.lock:
            self._request_ids[request_id] = copy.deepcopy(result)
        return result

    # -- inspection -------------------------------------------------------------------

    def resources(self) -> list[dict[str, Any]]:
        with self._world.lock:
            return [copy.deepcopy(o.resource) for o in self._operations.values()]

    def wait_quiet(self, timeout: float = 10.0) -> None:
        """Until no operation is running (all DONE)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._world.lock:
                pending = [o for o in self._operations.values() if not o.done.is_set()]
            if not pending:
                return
            time.sleep(0.01)
        raise TimeoutError(f"{len(pending)} operations still running after {timeout} s")

    # -- the API ----------------------------------------------------------------------

    def _lookup(self, project: str, scope: str, name: str) -> Operation:
        with self._world.lock:
            op = self._operations.get((project, scope, name))
        if op is None:
            raise not_found(f"projects/{project}/{scope}/operations/{name}")
        return op

    def _get(self, op: Operation) -> Any:
        with self._world.lock:
            return copy.deepcopy(op.resource)

    def _wait(self, op: Operation) -> Any:
        op.done.wait(self._world.wait_max_s)
        return self._get(op)

    def _zone_get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        return self._get(self._lookup(p["project"], f"zones/{p['zone']}", p["name"]))

    def _zone_wait(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        return self._wait(self._lookup(p["project"], f"zones/{p['zone']}", p["name"]))

    def _global_get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        return self._get(self._lookup(p["project"], "global", p["name"]))

    def _global_wait(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        return self._wait(self._lookup(p["project"], "global", p["name"]))
