"""Firewall rules of the fake GCE: the v1 ``firewalls`` API (insert, get,
list, patch, update, delete, each change a global operation), the checks of
a rule's body as GCE makes them (``firewall_resource``), GCE's four
``default-allow-*`` rules every project starts with, and whether the rules
let a connection through (``reachable``; the evaluation is catalog.py's).
"""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from tests.fake_gce import catalog
from tests.fake_gce.api import (
    API_ROOT,
    NAME,
    ApiError,
    Call,
    Handler,
    last,
    network_url,
    not_found,
    now,
    page,
    resource_id,
)
from tests.fake_gce.filters import compile_filter
from tests.fake_gce.operations import Operations
from tests.fake_gce.world import World

# The fields of the v1 Firewall resource: no `labels` (its description is
# where a client can say whose it is); GCE refuses a field it does not know.
_FIREWALL_FIELDS = frozenset(
    {"kind", "id", "creationTimestamp", "name", "description", "network", "priority",
     "sourceRanges", "destinationRanges", "sourceTags", "targetTags", "sourceServiceAccounts",
     "targetServiceAccounts", "allowed", "denied", "direction", "logConfig", "disabled",
     "selfLink", "params"}
)  # fmt: skip


class Firewalls:
    def __init__(
        self,
        world: World,
        operations: Operations,
        networks: Callable[[str], dict[str, catalog.Network]],
    ) -> None:
        """``networks(project)``: the project's networks (projects.py)."""
        self._world = world
        self._operations = operations
        self._networks = networks
        # (project, name) -> the rule as the API shows it.
        self.rules: dict[tuple[str, str], dict[str, Any]] = {}
        self._pending: set[tuple[str, str]] = set()  # being inserted

    def handlers(self) -> dict[str, Handler]:
        return {
            "firewalls.get": self._get,
            "firewalls.list": self._list,
            "firewalls.insert": self._insert,
            "firewalls.patch": self._patch,
            "firewalls.update": self._update,
            "firewalls.delete": self._delete,
        }

    def add_defaults(self, project: str) -> None:
        """A new project's rules: GCE's four ``default-allow-*`` at 65534."""
        with self._world.lock:
            for rule in catalog.default_firewalls(project):
                self.rules.setdefault((project, rule["name"]), rule)

    # -- inspection -------------------------------------------------------------------

    def resources(self, *, defaults: bool = False) -> list[dict[str, Any]]:
        """The firewall rules; GCE's own default-allow-* only with ``defaults``."""
        with self._world.lock:
            return [
                copy.deepcopy(f)
                for (_, name), f in sorted(self.rules.items())
                if defaults or not name.startswith("default-allow-")
            ]

    def find(self, name: str) -> dict[str, Any] | None:
        with self._world.lock:
            for (_, fw_name), fw in self.rules.items():
                if fw_name == name:
                    return copy.deepcopy(fw)
        return None

    def reachable(
        self,
        target: Mapping[str, Any],
        port: int,
        *,
        source_ip: str | None = None,
        source: Mapping[str, Any] | None = None,
    ) -> bool:
        """Whether a TCP connection to ``port`` of instance ``target`` gets
        through the rules: from the address ``source_ip`` (outside), or from
        the instance ``source`` (its internal IP and network tags)."""
        tags: list[str] = []
        if source is not None:
            source_ip = source["networkInterfaces"][0]["networkIP"]
            tags = list(source["tags"]["items"])
        assert source_ip is not None, "give source_ip or source"
        # The rules of the network's project (a Shared VPC's host project).
        network = target["networkInterfaces"][0]["network"]
        project = network.split("/projects/", 1)[1].split("/", 1)[0]
        with self._world.lock:
            rules = [copy.deepcopy(f) for (p, _), f in self.rules.items() if p == project]
        return catalog.ingress_allowed(
            rules,
            network=last(network),
            target_tags=target["tags"]["items"],
            port=port,
            source_ip=source_ip,
            source_tags=tags,
        )

    # -- the API ----------------------------------------------------------------------

    def _current(self, project: str, name: str) -> dict[str, Any]:
        fw = self.rules.get((project, name))
        if fw is None:
            raise not_found(f"projects/{project}/global/firewalls/{name}")
        return fw

    def _get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        with self._world.lock:
            return copy.deepcopy(self._current(p["project"], p["name"]))

    def _list(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        match = compile_filter(query.get("filter"))
        with self._world.lock:
            items = [
                copy.deepcopy(fw)
                for (proj, _), fw in sorted(self.rules.items())
                if proj == p["project"] and match(fw)
            ]
        return page("compute#firewallList", f"projects/{p['project']}/global/firewalls",
                    items, query)

    def _insert(self, call: Call, p: dict[str, str], query: dict[str, str], body: Any) -> Any:
        return self._operations.dedup(query, lambda: self.insert(p["project"], body))

    def insert(self, project: str, body: Any) -> Any:
        resource = firewall_resource(project, body)
        catalog.check_firewall_network(project, body, self._networks(project))
        key = (project, resource["name"])
        with self._world.lock:
            if key in self.rules or key in self._pending:
                raise ApiError(
                    409,
                    f"The resource 'projects/{project}/global/firewalls/{resource['name']}' "
                    "already exists",
                    "alreadyExists",
                )
            self._pending.add(key)
            op = self._operations.new(project, "global", "insert", resource)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            try:
                self._world.sleep(self._world.latency.firewall)
                with self._world.lock:
                    self.rules[key] = resource
            finally:
                with self._world.lock:
                    self._pending.discard(key)

        self._operations.spawn(op, work)
        return answer

    def _patch(self, call: Call, p: dict[str, str], query: dict[str, str], body: Any) -> Any:
        """PATCH: the fields given replace theirs, the others stay."""
        return self._change(p, body, "patch")

    def _update(self, call: Call, p: dict[str, str], query: dict[str, str], body: Any) -> Any:
        """PUT: the rule becomes the body (a field left out is cleared)."""
        return self._change(p, body, "update")

    def _change(self, p: dict[str, str], body: Any, kind: str) -> Any:
        key = (p["project"], p["name"])
        with self._world.lock:
            current = self._current(*key)
            given = {k: v for k, v in (body or {}).items() if k != "name"}
            if kind == "patch":
                merged = {**current, **given, "name": current["name"]}
            else:
                merged = {**given, "name": current["name"]}
            updated = firewall_resource(p["project"], merged, keep=current)
            catalog.check_firewall_network(p["project"], merged, self._networks(p["project"]))
            op = self._operations.new(p["project"], "global", kind, current)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            self._world.sleep(self._world.latency.firewall)
            with self._world.lock:
                if key in self.rules:
                    self.rules[key] = updated

        self._operations.spawn(op, work)
        return answer

    def _delete(self, call: Call, p: dict[str, str], query: dict[str, str], b: Any) -> Any:
        key = (p["project"], p["name"])
        with self._world.lock:
            current = self._current(*key)
            op = self._operations.new(p["project"], "global", "delete", current)
            answer = copy.deepcopy(op.resource)

        def work() -> None:
            self._world.sleep(self._world.latency.firewall)
            with self._world.lock:
                self.rules.pop(key, None)

        self._operations.spawn(op, work)
        return answer


# -- a rule's body ---------------------------------------------------------------------


def firewall_resource(
    project: str, body: Any, keep: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Check a rule's body as GCE does, in GCE's order; the rule to store
    (``keep``: the rule it replaces, whose id and creation time stay)."""
    name = _checked_name(body)
    allowed, denied = _checked_action(body)
    priority = _checked_priority(body)
    _check_protocols([*allowed, *denied])
    direction = body.get("direction") or "INGRESS"
    source_ranges, source_tags = _sources(body, direction)
    resource: dict[str, Any] = {
        "kind": "compute#firewall",
        "id": keep["id"] if keep else resource_id(),
        "creationTimestamp": keep["creationTimestamp"] if keep else now(),
        "name": name,
        "description": body.get("description", ""),
        "network": network_url(project, body.get("network")),
        "priority": priority,
        "direction": direction,
        "logConfig": {"enable": False},
        "disabled": bool(body.get("disabled", False)),
        "selfLink": f"{API_ROOT}/projects/{project}/global/firewalls/{name}",
    }
    if allowed:
        resource["allowed"] = allowed
    if denied:
        resource["denied"] = denied
    if source_ranges:
        resource["sourceRanges"] = source_ranges
    if source_tags:
        resource["sourceTags"] = source_tags
    if body.get("targetTags"):
        resource["targetTags"] = list(body["targetTags"])
    if body.get("destinationRanges"):
        resource["destinationRanges"] = list(body["destinationRanges"])
    return resource


def _checked_name(body: Any) -> str:
    """A mapping of known fields only, with a valid name; the name."""
    if not isinstance(body, dict):
        raise ApiError(400, "Required field 'resource' not specified", "required")
    if unknown := sorted(set(body) - _FIREWALL_FIELDS):
        raise ApiError(
            400,
            f'Invalid JSON payload received. Unknown name "{unknown[0]}" at \'resource\': '
            "Cannot find field.",
            "invalid",
        )
    name = body.get("name")
    if not name or not NAME.match(name):
        raise ApiError(400, f"Invalid value for field 'resource.name': '{name}'", "invalid")
    return str(name)


def _checked_action(body: Mapping[str, Any]) -> tuple[list[Any], list[Any]]:
    """(allowed, denied): exactly one of them given."""
    allowed = body.get("allowed") or []
    denied = body.get("denied") or []
    if not allowed and not denied:
        raise ApiError(
            400, "Required field 'resource.allowed' or 'resource.denied' not specified",
            "required",
        )
    if allowed and denied:
        # One rule allows or denies, never both (the real API's 400).
        raise ApiError(
            400, "Invalid value for field 'resource': only one of 'allowed' or 'denied' "
            "may be specified", "invalid",
        )
    return allowed, denied


def _checked_priority(body: Mapping[str, Any]) -> Any:
    priority = body.get("priority", 1000)
    if not isinstance(priority, int) or not 0 <= priority <= 65535:
        raise ApiError(
            400, f"Invalid value for field 'resource.priority': '{priority}'. Must be "
            "between 0 and 65535", "invalid",
        )
    return priority


def _check_protocols(rules: list[Any]) -> None:
    for rule in rules:
        if not rule.get("IPProtocol"):
            raise ApiError(400, "Required field 'IPProtocol' not specified", "required")
        for port in rule.get("ports") or []:
            if not re.match(r"^\d+(-\d+)?$", str(port)):
                raise ApiError(
                    400, f"Invalid value for field 'ports': '{port}'", "invalid"
                )


def _sources(body: Mapping[str, Any], direction: str) -> tuple[list[str], list[str]]:
    """(sourceRanges, sourceTags), GCE's default source filled in."""
    source_ranges = list(body.get("sourceRanges") or [])
    for cidr in source_ranges:
        try:
            ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            raise ApiError(
                400, f"Invalid value for field 'resource.sourceRanges': '{cidr}'", "invalid"
            ) from None
    source_tags = list(body.get("sourceTags") or [])
    if (
        direction == "INGRESS"
        and not source_ranges
        and not source_tags
        and not body.get("sourceServiceAccounts")
    ):
        # GCE's own default: an ingress rule with no source is open to the world.
        source_ranges = ["0.0.0.0/0"]
    return source_ranges, source_tags
