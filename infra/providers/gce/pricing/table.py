"""What a Compute Engine node costs per hour: a dated list-price table.

Figures are Google's public on-demand list prices for region us-central1
(Iowa), in USD, as recorded on ``PRICES_AS_OF`` from:

* https://cloud.google.com/compute/vm-instance-pricing  (per vCPU-hour and per GB-hour of
  each machine family; shared-core E2 types have their own prices)
* https://cloud.google.com/compute/gpus-pricing          (per GPU-hour)
* https://cloud.google.com/compute/disks-image-pricing   (persistent disk per GB-month)
* https://cloud.google.com/vpc/network-pricing           (in-use external IPv4 per hour)

They are estimates for ``status``: no committed-use or sustained-use
discount, no network egress, no OS licence (Debian images have none). Other
regions list up to about 30 % more; Spot prices change up to once a month
per region, so the Spot figure is the typical discount, not a quote. The
table was not re-fetched on the machine that built this (it has no
internet): check the pages above before relying on a figure.

A stopped (TERMINATED) node pays only its disk: vCPUs, memory, GPUs and the
ephemeral external IP are released with it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

PRICES_AS_OF = "2025-01-15"
REGION = "us-central1"
HOURS_PER_MONTH = 730.0  # how Google converts monthly disk prices to hourly

# Per-family on-demand rates: (USD per vCPU-hour, USD per GB-hour of memory).
_FAMILY_RATES: dict[str, tuple[float, float]] = {
    "e2": (0.021811, 0.002923),
    "n1": (0.031611, 0.004237),
    "n2": (0.031611, 0.004237),
    "n2d": (0.027502, 0.003686),
    "c3": (0.03465, 0.003938),
    # G2 is billed as vCPU + memory + its L4 GPUs (priced in _GPU_HOURLY).
    "g2": (0.024988, 0.0029279),
    # A2 likewise: vCPU + memory + its A100 GPUs.
    "a2": (0.031611, 0.004237),
}

# GB of memory per vCPU of each predefined shape, and the sizes that exist.
_SHAPES: dict[str, dict[str, float]] = {
    "e2": {"standard": 4.0, "highmem": 8.0, "highcpu": 1.0},
    "n1": {"standard": 3.75, "highmem": 6.5, "highcpu": 0.9},
    "n2": {"standard": 4.0, "highmem": 8.0, "highcpu": 1.0},
    "n2d": {"standard": 4.0, "highmem": 8.0, "highcpu": 1.0},
    "c3": {"standard": 4.0, "highmem": 8.0, "highcpu": 2.0},
    "g2": {"standard": 4.0},
}
_SIZES: dict[str, tuple[int, ...]] = {
    "e2": (2, 4, 8, 16, 32),
    "n1": (1, 2, 4, 8, 16, 32, 64, 96),
    "n2": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128),
    "n2d": (2, 4, 8, 16, 32, 48, 64, 80, 96, 128, 224),
    "c3": (4, 8, 22, 44, 88, 176),
    "g2": (4, 8, 12, 16, 24, 32, 48, 96),
}

# Shared-core and other shapes that are not vCPU x rate.
_FIXED_HOURLY: dict[str, float] = {
    "e2-micro": 0.008376,
    "e2-small": 0.016751,
    "e2-medium": 0.033503,
    # a2-highgpu-1g: 12 vCPU, 85 GB; its A100 is priced separately.
    "a2-highgpu-1g": 0.739477,
}

# USD per GPU-hour, on demand.
_GPU_HOURLY: dict[str, float] = {
    "nvidia-tesla-t4": 0.35,
    "nvidia-tesla-p4": 0.60,
    "nvidia-tesla-p100": 1.46,
    "nvidia-tesla-v100": 2.48,
    "nvidia-l4": 0.56,
    "nvidia-tesla-a100": 2.933908,
    "nvidia-a100-80gb": 3.92734,
}

# USD per GB-month of provisioned persistent disk capacity.
_DISK_GB_MONTH: dict[str, float] = {
    "pd-standard": 0.040,
    "pd-balanced": 0.100,
    "pd-ssd": 0.170,
    "pd-extreme": 0.125,
}

# An in-use ephemeral external IPv4 address, per hour (since 2024-02-01);
# half that on Spot VMs. A stopped VM holds none.
_EXTERNAL_IP_HOURLY = 0.005
_EXTERNAL_IP_SPOT_HOURLY = 0.0025

# Typical Spot prices as a fraction of on-demand (Google advertises 60-91 %
# off; E2/N1/N2 Spot VMs have been about 70 % off, GPUs about 60 %).
SPOT_FACTOR = 0.30
SPOT_GPU_FACTOR = 0.40

_PREDEFINED = re.compile(r"^(?P<family>[a-z][a-z0-9]*)-(?P<shape>[a-z]+)-(?P<vcpus>\d+)\Z")


@dataclass(frozen=True)
class Estimate:
    """USD per hour of one node as it is now, and what the figure leaves out."""

    usd_per_hour: float | None  # None: some part has no known price
    parts: dict[str, float] = field(default_factory=dict)  # machine, gpu, disk, ip
    notes: list[str] = field(default_factory=list)


def machine_hourly(machine_type: str, *, spot: bool = False) -> float | None:
    """On-demand (or typical Spot) USD/hour of a machine type's vCPUs and memory."""
    price = _FIXED_HOURLY.get(machine_type)
    if price is None:
        match = _PREDEFINED.match(machine_type)
        if match is None:
            return None
        family, shape, vcpus = match["family"], match["shape"], int(match["vcpus"])
        rates = _FAMILY_RATES.get(family)
        memory_per_vcpu = _SHAPES.get(family, {}).get(shape)
        if rates is None or memory_per_vcpu is None or vcpus not in _SIZES.get(family, ()):
            return None
        per_vcpu, per_gb = rates
        price = vcpus * per_vcpu + vcpus * memory_per_vcpu * per_gb
    return price * SPOT_FACTOR if spot else price


def gpu_hourly(gpu_type: str, count: int = 1, *, spot: bool = False) -> float | None:
    price = _GPU_HOURLY.get(gpu_type)
    if price is None:
        return None
    return price * count * (SPOT_GPU_FACTOR if spot else 1.0)


def disk_hourly(size_gb: float, disk_type: str) -> float | None:
    per_month = _DISK_GB_MONTH.get(disk_type)
    if per_month is None:
        return None
    return size_gb * per_month / HOURS_PER_MONTH


def external_ip_hourly(*, spot: bool = False) -> float:
    return _EXTERNAL_IP_SPOT_HOURLY if spot else _EXTERNAL_IP_HOURLY


def region_of(zone: str | None) -> str | None:
    return zone.rsplit("-", 1)[0] if zone else None


def node_hourly(
    machine_type: str | None,
    *,
    running: bool,
    spot: bool = False,
    accelerators: Sequence[tuple[str, int]] = (),
    disk_gb: float = 0.0,
    disk_type: str = "pd-balanced",
    zone: str | None = None,
    external_ip: bool = True,
) -> Estimate:
    """One node's USD/hour: machine, GPUs and external IP while it runs,
    and its boot disk always (a stopped node keeps paying for that)."""
    parts: dict[str, float] = {}
    notes: list[str] = []
    unknown = False
    disk = disk_hourly(disk_gb, disk_type) if disk_gb else 0.0
    if disk is None:
        unknown = True
        notes.append(f"no price known for disk type {disk_type}")
    else:
        parts["disk"] = disk
    if running:
        machine = machine_hourly(machine_type, spot=spot) if machine_type else None
        if machine is None:
            unknown = True
            notes.append(
                f"no price known for machine type {machine_type} "
                "(the table in infra/providers/gce/pricing/table.py has common "
                f"{', '.join(_FAMILY_RATES)} shapes)"
            )
        else:
            parts["machine"] = machine
        for gpu_type, count in accelerators:
            gpu = gpu_hourly(gpu_type, count, spot=spot)
            if gpu is None:
                unknown = True
                notes.append(f"no price known for GPU {gpu_type}")
            else:
                parts["gpu"] = parts.get("gpu", 0.0) + gpu
        if external_ip:
            parts["ip"] = external_ip_hourly(spot=spot)
        if spot:
            notes.append("Spot price estimated as a typical discount; the real one varies")
    region = region_of(zone)
    if region and region != REGION:
        notes.append(f"{REGION} prices used; {region} lists differ (often higher)")
    total = None if unknown else sum(parts.values())
    return Estimate(total, parts, notes)
