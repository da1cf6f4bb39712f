"""Projects of the fake GCE and what is global in them: each project's
networks (made on its first request as GCE makes a new project: the
auto-mode ``default`` network), its project metadata
(commonInstanceMetadata), and the read-only API over them and the public
images: ``projects.get``, ``networks.get``, ``images.get`` and
``images.getFromFamily`` (the tables are catalog.py's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tests.fake_gce import catalog, identity
from tests.fake_gce.api import API_ROOT, Call, Handler, fingerprint, not_found
from tests.fake_gce.world import World


class Projects:
    def __init__(self, world: World, on_new: Callable[[str], None]) -> None:
        """``on_new(project)`` runs once per project, when it is first seen
        (firewalls.py adds GCE's default rules)."""
        self._world = world
        self._on_new = on_new
        self._networks: dict[str, dict[str, catalog.Network]] = {}
        self.metadata: dict[str, dict[str, str]] = {}

    def handlers(self) -> dict[str, Handler]:
        return {
            "images.get": self._images_get,
            "images.getFromFamily": self._images_get_from_family,
            "networks.get": self._networks_get,
            "projects.get": self._projects_get,
        }

    def networks(self, project: str) -> dict[str, catalog.Network]:
        """The project's networks, made on its first request as GCE makes a
        new project: the auto-mode `default` network and its default rules."""
        with self._world.lock:
            networks = self._networks.get(project)
            if networks is None:
                regions = [z.rsplit("-", 1)[0] for z in self._world.zones]
                networks = {"default": catalog.default_network(regions)}
                self._networks[project] = networks
                self._on_new(project)
                self.metadata.setdefault(project, {})
            return networks

    def add_network(
        self, name: str, subnets: Mapping[str, Sequence[str]], *, project: str = "fake-project",
        auto: bool = False,
    ) -> None:
        """A VPC network: custom mode (``auto`` False) with ``subnets``
        (region -> subnetwork names)."""
        networks = self.networks(project)
        with self._world.lock:
            networks[name] = catalog.Network(name, auto, {r: list(n) for r, n in subnets.items()})

    # -- the API ----------------------------------------------------------------------

    def _images_get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        image = catalog.find_image(
            p["image_project"], f"projects/{p['image_project']}/global/images/{p['name']}"
        )
        return catalog.image_resource(image)

    def _images_get_from_family(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        image = catalog.find_image(
            p["image_project"], f"projects/{p['image_project']}/global/images/family/{p['name']}"
        )
        return catalog.image_resource(image)

    def _networks_get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        with self._world.lock:
            net = self.networks(p["project"]).get(p["name"])
            if net is None:
                raise not_found(f"projects/{p['project']}/global/networks/{p['name']}")
            return catalog.network_resource(p["project"], net)

    def _projects_get(self, call: Call, p: dict[str, str], q: Any, b: Any) -> Any:
        with self._world.lock:
            items = [{"key": k, "value": v}
                     for k, v in self.metadata.get(p["project"], {}).items()]
        return {
            "kind": "compute#project",
            "id": identity.project_number(p["project"]),
            "name": p["project"],
            "commonInstanceMetadata": {
                "kind": "compute#metadata", "fingerprint": fingerprint(items), "items": items,
            },
            "defaultNetworkTier": "PREMIUM",
            "defaultServiceAccount": identity.default_account(p["project"]),
            "selfLink": f"{API_ROOT}/projects/{p['project']}",
        }
