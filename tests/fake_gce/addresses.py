"""The addresses the fake GCE hands its instances when their backend
leaves the choice to it: the internal networkIP (10.128.x.y), assigned at
create and kept, and the ephemeral external natIP (TEST-NET-3, 203.0.113.x,
never contacted), given when the instance runs, dropped when it stops, a new
one after each start. A reserved static address (``natIP`` in the insert's
accessConfig) stays through stop and start.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from typing import Any

from tests.fake_gce.api import ApiError
from tests.fake_gce.world import World


class AddressPool:
    def __init__(self, world: World, nat_ips_in_use: Callable[[], set[str | None]]) -> None:
        """``nat_ips_in_use()``: the external addresses instances hold now,
        called with the lock held."""
        self._world = world
        self._in_use = nat_ips_in_use
        self._next_internal = 2
        self._next_nat = 10

    def internal_ip(self) -> str:
        with self._world.lock:
            n = self._next_internal
            self._next_internal += 1
        return str(ipaddress.ip_address("10.128.0.0") + n)

    def give_nat(self, resource: dict[str, Any], nat_ip: str | None) -> None:
        """Attach an ephemeral external IP (new each time) to the access config."""
        for nic in resource["networkInterfaces"]:
            for access in nic.get("accessConfigs", []):
                if access.get("x-fake-static"):
                    access["natIP"] = access["x-fake-static"]
                    continue
                access["natIP"] = nat_ip or self._nat_ip()
                nat_ip = None  # only the first access config gets the backend's address

    def drop_nat(self, resource: dict[str, Any]) -> None:
        for nic in resource["networkInterfaces"]:
            for access in nic.get("accessConfigs", []):
                if not access.get("x-fake-static"):
                    access.pop("natIP", None)

    def _nat_ip(self) -> str:
        with self._world.lock:
            used = self._in_use()
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
