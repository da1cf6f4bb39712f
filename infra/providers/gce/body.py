"""The parts of a new instance that follow from cluster.yaml's ``gce``
alone: its boot disk, network interface, scheduling and GPUs. Pure (config
in, ``compute_v1`` messages out); ``GceInstances._instance_body``
(instances.py) puts them together with what the API and the state add (the
labels, the SSH key's metadata, the network, the image's size).

The scheduling rules are Compute Engine's: a machine with GPUs, attached
or built in, cannot live-migrate, so it must TERMINATE on host maintenance
(GCE refuses MIGRATE with accelerators).
"""

from __future__ import annotations

from collections.abc import Mapping

from infra.providers.gce import checks
from infra.providers.gce._google import compute_v1
from infra.providers.gce.config import GceConfig


def boot_disk(
    gce: GceConfig, zone: str, labels: Mapping[str, str], image_gb: int | None
) -> compute_v1.AttachedDisk:
    """The boot disk, of ``gce.image``, at least the image's size."""
    return compute_v1.AttachedDisk(
        boot=True,
        auto_delete=True,  # `down` leaves no disk to pay for
        initialize_params=compute_v1.AttachedDiskInitializeParams(
            source_image=gce.image,
            disk_size_gb=checks.disk_gb(gce, image_gb),
            disk_type=f"zones/{zone}/diskTypes/{gce.disk_type}",
            labels=dict(labels),
        ),
    )


def network_interface(gce: GceConfig, network: str, zone: str) -> compute_v1.NetworkInterface:
    """The node's network interface, in gce.subnetwork when set."""
    nic = compute_v1.NetworkInterface(
        network=network,
        # An external address: this machine reaches sshd on it.
        access_configs=[
            compute_v1.AccessConfig(
                name="External NAT", type_="ONE_TO_ONE_NAT", network_tier="PREMIUM"
            )
        ],
    )
    if gce.subnetwork:
        region = zone.rsplit("-", 1)[0]
        nic.subnetwork = (
            gce.subnetwork
            if "/" in gce.subnetwork
            else f"regions/{region}/subnetworks/{gce.subnetwork}"
        )
    return nic


def scheduling(gce: GceConfig) -> compute_v1.Scheduling:
    """Spot or standard, and what happens on host maintenance."""
    result = compute_v1.Scheduling()
    if gce.preemptible:
        result.provisioning_model = "SPOT"
        # STOP, not DELETE: a preempted node keeps its disk; `up` starts it again.
        result.instance_termination_action = "STOP"
        result.automatic_restart = False
        result.on_host_maintenance = "TERMINATE"
    if checks.builtin_gpus(gce.machine_type) is not None or gce.accelerator is not None:
        # A2/G2/A3 (GPUs built in) or attached GPUs: no live migration.
        result.on_host_maintenance = "TERMINATE"
    return result


def accelerators(gce: GceConfig, project: str, zone: str) -> list[compute_v1.AcceleratorConfig]:
    """The GPUs attached to the node (none for a machine with GPUs built in)."""
    if gce.accelerator is None:
        return []
    return [
        compute_v1.AcceleratorConfig(
            accelerator_type=(
                f"projects/{project}/zones/{zone}/acceleratorTypes/{gce.accelerator.type}"
            ),
            accelerator_count=gce.accelerator.count,
        )
    ]
