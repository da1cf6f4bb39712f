"""What the cluster's nodes cost, from pricing/table.py's list prices: of
the nodes as they are (``status``) and of what ``up`` would create; with
the plan's line of one new node, the provider's ``Pricing`` (base.py)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from infra.providers.base import Node, NodeState
from infra.providers.gce import checks, identity
from infra.providers.gce.api import GceApi
from infra.providers.gce.pricing import table as pricing

log = logging.getLogger("tfcluster")


class GcePricing(GceApi):
    """Cost estimates and the plan line of one new node."""

    def hourly_cost(self, nodes: Sequence[Node]) -> float | None:
        """List-price USD/hour (pricing/table.py): machine, GPUs and external
        IP of running nodes, the boot disk of every node, stopped ones too."""
        total = 0.0
        for node in nodes:
            estimate = pricing.node_hourly(
                node.machine_type,
                running=node.state in (NodeState.RUNNING, NodeState.PENDING),
                spot=node.preemptible,
                accelerators=_parse_accelerators(node.accelerators),
                disk_gb=self._disk_gb.get(node.name) or checks.disk_gb(self.gce, self._image_gb),
                disk_type=self.gce.disk_type,
                zone=node.zone,
            )
            level = logging.INFO if estimate.usd_per_hour is not None else logging.WARNING
            notes = [(note, level) for note in estimate.notes]
            if (
                node.state is NodeState.STOPPED
                and self.gce.local_ssd_on_stop == "keep"
                and checks.bundles_local_ssd(node.machine_type or "")
            ):
                # A hidden bill: said even where the rest is priced.
                notes.append((
                    f"the Local SSD data a stopped {node.machine_type} keeps (gce."
                    "local_ssd_on_stop: keep) is billed and not in the estimate",
                    logging.WARNING,
                ))  # fmt: skip
            for note, note_level in notes:
                if note not in self._unpriced:  # each note once per process
                    self._unpriced.add(note)
                    log.log(note_level, "cost estimate: %s", note)
            if estimate.usd_per_hour is None:
                return None
            total += estimate.usd_per_hour
        return total

    def planned_node(self) -> str | None:
        gce = self.gce
        parts = [gce.machine_type]
        if gce.accelerator is not None:
            parts.append(f"{gce.accelerator.count} x {gce.accelerator.type}")
        elif (built_in := checks.builtin_gpus(gce.machine_type)) is not None:
            parts.append(f"{built_in[1]} x {built_in[0]} built in")
        if gce.preemptible:
            parts.append("spot")
        # The image's size is known once check_config has read it (not on a
        # dry run without credentials: then at least the default).
        parts.append(f"{checks.disk_gb(gce, self._image_gb)} GB {gce.disk_type}")
        zones = gce.zones
        where = f"zone {zones[0]}" + (f", else {', '.join(zones[1:])}" if zones[1:] else "")
        return ", ".join(parts) + ", " + where

    def planned_identity(self) -> str | None:
        gce = self.gce
        scopes = ", ".join(identity.short_scopes(identity.scope_urls(gce.scopes)))
        return f"service account {gce.service_account} (scopes {scopes})"

    def planned_cost(self, count: int) -> float | None:
        gce = self.gce
        # Attached or built in (G2, A2, A3): the GPUs are billed either way.
        gpus = checks.gpus(gce)
        accelerators = [gpus] if gpus else []
        estimate = pricing.node_hourly(
            gce.machine_type,
            running=True,
            spot=gce.preemptible,
            accelerators=accelerators,
            disk_gb=checks.disk_gb(gce, self._image_gb),
            disk_type=gce.disk_type,
            zone=gce.zones[0],
        )
        return None if estimate.usd_per_hour is None else estimate.usd_per_hour * count

    def price_source(self) -> str:
        return (
            f"{pricing.REGION} list prices as of {pricing.PRICES_AS_OF}, "
            "infra/providers/gce/pricing/table.py"
        )


def _parse_accelerators(text: str | None) -> list[tuple[str, int]]:
    """``"1 x nvidia-tesla-t4, 2 x nvidia-l4"`` (as ``Node.accelerators``) as pairs."""
    out = []
    for part in (text or "").split(","):
        count, sep, gpu = part.strip().partition(" x ")
        if sep and count.isdigit():
            out.append((gpu.strip(), int(count)))
    return out
