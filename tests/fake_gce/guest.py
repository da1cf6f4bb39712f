"""Guest attributes of the fake GCE's instances
(``instances.getGuestAttributes``): with ``enable-guest-attributes=TRUE``
in its metadata, a RUNNING instance's guest agent publishes its SSH host
keys under ``hostkeys/<type>`` = base64 (what ``InstanceBackend.host_keys``
says), ``Latency.host_keys`` seconds after it runs; until then, when
disabled or stopped, the call answers 404. A test may publish attributes of
its own over the backend's (``set``).
"""

from __future__ import annotations

import copy
import re
import time
from typing import Any

from tests.fake_gce.api import API_ROOT, ApiError, Call, Handler, not_found
from tests.fake_gce.instances import Instances
from tests.fake_gce.world import World


class GuestAttributes:
    def __init__(self, world: World, instances: Instances) -> None:
        self._world = world
        self._instances = instances

    def handlers(self) -> dict[str, Handler]:
        return {"instances.getGuestAttributes": self._get}

    def set(self, name: str, path: str, value: str | None, zone: str | None = None) -> None:
        """Publish ``path`` (``namespace/key``) as the guest would, over
        what the backend publishes; None removes it again."""
        inst = self._instances.find(name, zone)
        with self._world.lock:
            if value is None:
                inst.guest_attributes.pop(path, None)
            else:
                inst.guest_attributes[path] = value

    def _published(self, project: str, zone: str, name: str, path: str) -> dict[str, str]:
        """What the instance's guest publishes now: path -> value (404 for
        no such instance, then 400 for a malformed ``path``, as GCE checks)."""
        inst = self._instances.lookup(project, zone, name)
        if not re.match(r"^([\w-]+/[\w-]*)?$", path):
            raise ApiError(400, f"Invalid value for field 'queryPath': '{path}'", "invalid")
        with self._world.lock:
            resource = copy.deepcopy(inst.resource)
            since = inst.running_since
            overrides = dict(inst.guest_attributes)
        items = {i.get("key"): i.get("value") for i in resource["metadata"]["items"]}
        attributes: dict[str, str] = {}
        if (
            str(items.get("enable-guest-attributes", "")).upper() == "TRUE"
            and resource["status"] == "RUNNING"
            and since is not None
            and time.monotonic() - since >= self._world.latency.host_keys
        ):
            for line in self._world.backend.host_keys(resource):
                fields = line.split()
                if len(fields) >= 2:
                    attributes[f"hostkeys/{fields[0]}"] = fields[1]
            attributes.update(overrides)
        return attributes

    def _get(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        path = query.get("queryPath", "")
        base = f"projects/{p['project']}/zones/{p['zone']}/instances/{p['name']}"
        answer: dict[str, Any] = {
            "kind": "compute#guestAttributes",
            "queryPath": path,
            "selfLink": f"{API_ROOT}/{base}/guestAttributes/{path}",
        }
        attributes = self._published(p["project"], p["zone"], p["name"], path)
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
            raise not_found(f"{base}/guestAttributes/{path}")
        return answer
