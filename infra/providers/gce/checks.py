"""What Compute Engine would refuse, checked before anything is created.

Real GCE refuses a bad instance body only at ``instances.insert``, after
``up`` has made the firewall rules, and with a message that names a field
path rather than the cluster.yaml key. So the provider checks first:

* ``check_config`` (no API call): machine family vs accelerators and
  their counts, disk type vs machine family, the image's form, GPUs on an
  image known to lack the NVIDIA driver, ``gce.metadata``.
* ``check_image_size`` and ``check_subnetwork``, given what the API
  answered (``GceProject.check_plan`` reads the image and the network,
  before ``prepare`` changes anything): disk size vs the image's size, a
  custom-mode network's subnetwork in the region of every zone.

Both run on the way up only (``GceProject.check_config``: `up` and
`up --dry-run`), so that `down`, `stop` and `status` work whatever
cluster.yaml says now.

Each failure is one ``ConfigError`` line (exit 2) naming the key, the value
and the valid choices. The tables are the documented Compute Engine rules
(GPU machine types, the GPU platforms page, the disk-type support matrix);
a machine family missing from them is not checked (a newer family: GCE
itself answers, and ``up`` reports its 400).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from infra.errors import ConfigError
from infra.providers.gce.config import GceConfig

# GPUs that attach to an N1 VM (guestAccelerators), with the counts GCE allows.
N1_GPUS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-p4": (1, 2, 4),
}

# Accelerator-optimized families: the GPUs come with the machine type (its
# name says how many) and the body carries no guestAccelerators.
_A2 = re.compile(r"^a2-(highgpu|megagpu|ultragpu)-(\d+)g\Z")
_A3 = re.compile(r"^a3-(highgpu|megagpu|edgegpu|ultragpu)-(\d+)g\Z")
# A3 High and Edge carry H100s, A3 Mega the H100 Mega, A3 Ultra H200s (the
# GPU machine types page: "A3 Ultra machine types have NVIDIA H200 SXM GPUs
# (nvidia-h200-141gb) attached").
_A3_GPUS = {
    "highgpu": "nvidia-h100-80gb",
    "edgegpu": "nvidia-h100-80gb",
    "megagpu": "nvidia-h100-mega-80gb",
    "ultragpu": "nvidia-h200-141gb",
}
_G2_GPUS = {4: 1, 8: 1, 12: 1, 16: 1, 32: 1, 24: 2, 48: 4, 96: 8}
_G2 = re.compile(r"^g2-standard-(\d+)\Z")

# The boot disk types each machine family can use. Families not listed are
# not checked.
_PD = ("pd-standard", "pd-balanced", "pd-ssd")
_HYPERDISK = ("hyperdisk-balanced", "hyperdisk-extreme", "hyperdisk-throughput")
DISK_TYPES: dict[str, tuple[str, ...]] = {
    "e2": _PD,
    "n1": _PD,
    "n2": (*_PD, "pd-extreme"),
    "n2d": _PD,
    "t2d": _PD,
    "t2a": ("pd-balanced", "pd-ssd"),
    "c2": _PD,
    "c2d": _PD,
    "m1": (*_PD, "pd-extreme"),
    "a2": _PD,
    "g2": ("pd-balanced", "pd-ssd"),
    "c3": ("pd-balanced", "pd-ssd", *_HYPERDISK),
    "c3d": ("pd-balanced", "pd-ssd", *_HYPERDISK),
    "a3": ("pd-balanced", "pd-ssd", *_HYPERDISK),
    "n4": ("hyperdisk-balanced",),
    "c4": ("hyperdisk-balanced", "hyperdisk-extreme"),
}

# Public image projects whose images have no NVIDIA kernel driver: a GPU on
# them is paid for and unused (tensorflow[and-cuda] brings CUDA, not the driver).
DRIVERLESS_PROJECTS = frozenset(
    {
        "debian-cloud",
        "ubuntu-os-cloud",
        "centos-cloud",
        "rocky-linux-cloud",
        "rhel-cloud",
        "opensuse-cloud",
        "suse-cloud",
        "fedora-coreos-cloud",
    }
)
# Deep Learning VM images: the NVIDIA driver is installed on first boot when
# the metadata says install-nvidia-driver=True (tfcluster sets it for GPU nodes).
DLVM_PROJECT = "deeplearning-platform-release"
DRIVER_KEY = "install-nvidia-driver"

# A new VM's boot disk when gce.disk_gb is not set: this, or the image's own
# size if larger (a Deep Learning VM image is about 50 GB).
DEFAULT_DISK_GB = 20

# GCE metadata keys: letters, digits, '-' and '_', at most 128 characters;
# a value at most 256 KB.
_METADATA_KEY = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
_METADATA_VALUE_BYTES = 256 * 1024

_IMAGE = re.compile(
    r"^(?:https://(?:www|compute)\.googleapis\.com/compute/v1/)?"
    r"(?:projects/(?P<project>[a-z][-a-z0-9.:]*)/)?global/images/"
    r"(?:family/(?P<family>[a-z][-a-z0-9]*)|(?P<image>[a-z][-a-z0-9]*))$"
)


@dataclass(frozen=True)
class ImageRef:
    """``gce.image`` taken apart: an image or a family, in a project (None:
    the cluster's own project)."""

    project: str | None
    image: str | None
    family: str | None

    def text(self, default_project: str) -> str:
        tail = f"family/{self.family}" if self.family else str(self.image)
        return f"projects/{self.project or default_project}/global/images/{tail}"


def parse_image(value: str) -> ImageRef:
    match = _IMAGE.match(value)
    if match is None:
        raise ConfigError(
            f"gce.image: {value!r} is not an image path; write "
            "projects/PROJECT/global/images/family/FAMILY (the newest of a family) or "
            "projects/PROJECT/global/images/IMAGE"
        )
    return ImageRef(match["project"], match["image"], match["family"])


def family(machine_type: str) -> str:
    """``n1-standard-4`` -> ``n1``; custom types (``n2-custom-4-8192``) too."""
    return machine_type.split("-", 1)[0]


def builtin_gpus(machine_type: str) -> tuple[str, int] | None:
    """The GPUs an accelerator-optimized machine type comes with."""
    if match := _A2.match(machine_type):
        kind, count = match[1], int(match[2])
        return ("nvidia-a100-80gb" if kind == "ultragpu" else "nvidia-tesla-a100", count)
    if match := _A3.match(machine_type):
        kind, count = match[1], int(match[2])
        return (_A3_GPUS[kind], count)
    if (match := _G2.match(machine_type)) and int(match[1]) in _G2_GPUS:
        return ("nvidia-l4", _G2_GPUS[int(match[1])])
    return None


def bundles_local_ssd(machine_type: str) -> bool:
    """Whether the machine type comes with Local SSD, which `stop` must be
    told to keep or discard. The Local SSD page: "Z4D, Z4M, Z3, A5X, A4X Max,
    A4X, A4, A3, and A2 Ultra machine series: every machine type comes with
    Local SSD storage"; C3, C3D, C4... only the types that end in -lssd."""
    fam = family(machine_type)
    return (
        fam in ("a3", "a4", "a4x", "a5x", "z3", "z4d", "z4m")
        or machine_type.startswith("a2-ultragpu-")
        or machine_type.endswith("-lssd")
    )


def gpus(gce: GceConfig) -> tuple[str, int] | None:
    """The GPUs each node has (attached or built in); None for none."""
    if gce.accelerator is not None:
        return gce.accelerator.type, gce.accelerator.count
    return builtin_gpus(gce.machine_type)


def check_config(gce: GceConfig, *, reserved_metadata: Iterable[str]) -> None:
    """The checks that need no API call; ConfigError on the first problem."""
    image = parse_image(gce.image)
    _check_accelerator(gce)
    _check_disk_type(gce)
    _check_metadata(gce.metadata, reserved_metadata)
    if gpus(gce) is not None and image.project in DRIVERLESS_PROJECTS:
        what = "gce.accelerator" if gce.accelerator else f"gce.machine_type {gce.machine_type}"
        raise ConfigError(
            f"gce.image: {gce.image} has no NVIDIA driver, so the GPUs of {what} would be "
            f"billed and unused; use a Deep Learning VM image (projects/{DLVM_PROJECT}/"
            "global/images/family/...: tfcluster sets install-nvidia-driver=True) or your "
            "own image with the driver"
        )


def _check_accelerator(gce: GceConfig) -> None:
    fam = family(gce.machine_type)
    built_in = builtin_gpus(gce.machine_type)
    acc = gce.accelerator
    if acc is None:
        return
    if built_in is not None:
        raise ConfigError(
            f"gce.accelerator: {gce.machine_type} comes with {built_in[1]} x {built_in[0]} "
            "built in and takes no accelerator; remove gce.accelerator (or use an n1 "
            f"machine type with one of {', '.join(N1_GPUS)})"
        )
    if acc.type not in N1_GPUS:
        raise ConfigError(
            f"gce.accelerator.type: {acc.type!r} cannot be attached to a VM; attachable GPUs "
            f"(n1 machine types): {', '.join(N1_GPUS)}; nvidia-l4 comes with g2-standard-*, "
            "nvidia-tesla-a100 with a2-highgpu-*, nvidia-h100-80gb with a3-highgpu-8g, "
            "nvidia-h200-141gb with a3-ultragpu-8g (set gce.machine_type, no accelerator)"
        )
    if fam != "n1":
        raise ConfigError(
            f"gce.machine_type: {gce.machine_type} takes no GPU; {acc.type} attaches only to "
            "n1 machine types (for example n1-standard-4), or use g2-standard-4 (1 x nvidia-l4 "
            "built in) without gce.accelerator"
        )
    allowed = N1_GPUS[acc.type]
    if acc.count not in allowed:
        raise ConfigError(
            f"gce.accelerator.count: {acc.count} {acc.type} per VM is not offered; choose "
            f"{', '.join(map(str, allowed))}"
        )


def _check_disk_type(gce: GceConfig) -> None:
    fam = family(gce.machine_type)
    allowed = DISK_TYPES.get(fam)
    if allowed is not None and gce.disk_type not in allowed:
        raise ConfigError(
            f"gce.disk_type: {gce.disk_type!r} cannot be the boot disk of {gce.machine_type} "
            f"({fam} machine types); choose {', '.join(allowed)}"
        )


def _check_metadata(metadata: Mapping[str, str], reserved: Iterable[str]) -> None:
    reserved = set(reserved)
    for key, value in metadata.items():
        if key in reserved:
            raise ConfigError(
                f"gce.metadata: {key} is set by tfcluster itself ({', '.join(sorted(reserved))}); "
                "remove it"
            )
        if not _METADATA_KEY.match(key):
            raise ConfigError(
                f"gce.metadata: {key[:60]!r} is not a metadata key: 1-128 letters, digits, "
                "'-' and '_'"
            )
        if len(value.encode()) > _METADATA_VALUE_BYTES:
            raise ConfigError(f"gce.metadata.{key}: the value is over 256 KB, GCE's limit")


def disk_gb(gce: GceConfig, image_gb: int | None) -> int:
    """The boot disk size: gce.disk_gb, else the default or the image's size."""
    if gce.disk_gb is not None:
        return gce.disk_gb
    return max(DEFAULT_DISK_GB, image_gb or 0)


def check_image_size(gce: GceConfig, image: str, image_gb: int) -> None:
    """GCE: 'Requested disk size cannot be smaller than the image size'."""
    if gce.disk_gb is not None and gce.disk_gb < image_gb:
        raise ConfigError(
            f"gce.disk_gb: {gce.disk_gb} GB is smaller than the image {image} "
            f"({image_gb} GB); set at least {image_gb}, or leave disk_gb out (default: "
            "the image's size when over 20 GB)"
        )


def region(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


_SUBNET = re.compile(r"(?:^|/)regions/(?P<region>[a-z0-9-]+)/subnetworks/(?P<name>[a-z0-9-]+)$")


def check_subnetwork(
    gce: GceConfig, network: str, custom_mode: bool, subnet_urls: Sequence[str]
) -> None:
    """A custom-mode network needs gce.subnetwork, and the subnetwork must
    exist in the region of every zone of gce.zones."""
    subnets: dict[str, set[str]] = {}  # region -> names
    for url in subnet_urls:
        if match := _SUBNET.search(url):
            subnets.setdefault(match["region"], set()).add(match["name"])
    regions = sorted({region(z) for z in gce.zones})
    offered = (
        ", ".join(f"{name} ({reg})" for reg in sorted(subnets) for name in sorted(subnets[reg]))
        or "none"
    )
    if gce.subnetwork is None:
        if custom_mode:
            raise ConfigError(
                f"gce.subnetwork: network {network} is a custom-mode VPC, so each VM needs a "
                f"subnetwork in its region ({', '.join(regions)}); its subnetworks: {offered}"
            )
        return
    path = _SUBNET.search(gce.subnetwork)
    if path is not None:
        wrong = [z for z in gce.zones if region(z) != path["region"]]
        if wrong:
            raise ConfigError(
                f"gce.subnetwork: {gce.subnetwork} is in region {path['region']}, but "
                f"{', '.join(wrong)} of gce.zones is not; list zones of {path['region']} "
                "only, or give the subnetwork by name"
            )
        name = path["name"]
    else:
        name = gce.subnetwork
    missing = [reg for reg in regions if name not in subnets.get(reg, set())]
    if missing:
        raise ConfigError(
            f"gce.subnetwork: network {network} has no subnetwork {name!r} in "
            f"{', '.join(missing)} (the region of a zone in gce.zones); its subnetworks: "
            f"{offered}"
        )


def oslogin_enforced(items: Mapping[str, str]) -> bool:
    """Project metadata ``enable-oslogin=TRUE`` (what the organisation policy
    compute.requireOsLogin also sets): the VMs may ignore our ssh-keys."""
    return items.get("enable-oslogin", "").strip().upper() == "TRUE"


OSLOGIN_HINT = (
    "the project enforces OS Login (enable-oslogin=TRUE in its metadata, or the "
    "organisation policy compute.requireOsLogin), so the VMs ignore tfcluster's ssh-keys "
    "metadata: set enable-oslogin=FALSE in the project metadata (`gcloud compute "
    "project-info add-metadata --metadata enable-oslogin=FALSE`) or have the policy lifted "
    "for this project"
)
