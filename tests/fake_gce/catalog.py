"""What the fake Compute Engine offers, and the insert rules that depend on it.

Real Compute Engine refuses an instance body whose machine type or GPU is
not offered in the zone, whose GPUs do not fit the machine family, whose
boot disk is smaller than its image or of a type the family cannot use, or
whose network interface lacks the subnetwork a custom-mode network needs.
The fake refuses the same, from these tables (a subset of the real ones,
with the same shape): machine families, the machine types and GPU types
each zone offers, public images with their sizes, and networks.

Kept apart from the resource modules: pure data and pure checks that raise
``Refusal`` (front.py turns it into its HTTP error), so a test can read
the very table the fake judges by.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class Refusal(Exception):
    """An HTTP error answer: status, message, reason (as GCE's error body)."""

    def __init__(self, status: int, message: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.reason = reason


# -- machine types -----------------------------------------------------------------------

# GPUs that attach to N1 (guestAccelerators) and the counts GCE allows.
ATTACHABLE_GPUS: dict[str, tuple[int, ...]] = {
    "nvidia-tesla-t4": (1, 2, 4),
    "nvidia-tesla-v100": (1, 2, 4, 8),
    "nvidia-tesla-p100": (1, 2, 4),
    "nvidia-tesla-p4": (1, 2, 4),
}

# Machine types with their GPUs built in (accelerator-optimized families).
BUILTIN_GPUS: dict[str, tuple[str, int]] = {
    "g2-standard-4": ("nvidia-l4", 1),
    "g2-standard-8": ("nvidia-l4", 1),
    "g2-standard-24": ("nvidia-l4", 2),
    "a2-highgpu-1g": ("nvidia-tesla-a100", 1),
    "a2-highgpu-2g": ("nvidia-tesla-a100", 2),
    "a2-ultragpu-1g": ("nvidia-a100-80gb", 1),
    "a3-highgpu-8g": ("nvidia-h100-80gb", 8),
    # "A3 Ultra machine types have NVIDIA H200 SXM GPUs (nvidia-h200-141gb)
    # attached" (the GPU machine types page).
    "a3-ultragpu-8g": ("nvidia-h200-141gb", 8),
}

# Machine types that come with Local SSD (375 GiB disks), listed on the
# instance as SCRATCH disks; `instances.stop` of such an instance needs
# discardLocalSsd. The Local SSD page: "A3, and A2 Ultra machine series:
# every machine type comes with Local SSD storage"; the counts are the
# machine types page's (a3-highgpu-8g 6,000 GiB, a3-ultragpu-8g 12,000 GiB).
LOCAL_SSD_DISKS: dict[str, int] = {
    "a2-ultragpu-1g": 1,
    "a3-highgpu-8g": 16,
    "a3-ultragpu-8g": 32,
}

_GENERAL = (
    "e2-micro", "e2-small", "e2-medium", "e2-standard-2", "e2-standard-4", "e2-standard-8",
    "e2-highmem-2", "n1-standard-1", "n1-standard-2", "n1-standard-4", "n1-standard-8",
    "n1-highmem-4", "n2-standard-2", "n2-standard-4", "n2-standard-8", "c3-standard-4",
    "n4-standard-2", "n4-standard-4",
)
_G2 = ("g2-standard-4", "g2-standard-8", "g2-standard-24")
_A2 = ("a2-highgpu-1g", "a2-highgpu-2g", "a2-ultragpu-1g")

# Zone -> machine types offered there. As on GCE, not every zone has every
# family: G2 is not in us-central1-f, A2 only in us-central1-a and -c.
MACHINE_TYPES: dict[str, tuple[str, ...]] = {
    "us-central1-a": (*_GENERAL, *_G2, *_A2, "a3-highgpu-8g", "a3-ultragpu-8g"),
    "us-central1-b": (*_GENERAL, *_G2),
    "us-central1-c": (*_GENERAL, *_G2, *_A2),
    "us-central1-f": _GENERAL,
    "europe-west1-b": (*_GENERAL, *_G2),
}

# Zone -> GPU types offered there.
ACCELERATOR_TYPES: dict[str, tuple[str, ...]] = {
    "us-central1-a": ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p4", "nvidia-l4",
                      "nvidia-tesla-a100", "nvidia-h100-80gb"),
    "us-central1-b": ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-l4"),
    "us-central1-c": ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100",
                      "nvidia-tesla-p4", "nvidia-l4", "nvidia-tesla-a100"),
    "us-central1-f": ("nvidia-tesla-t4", "nvidia-tesla-v100", "nvidia-tesla-p100"),
    "europe-west1-b": ("nvidia-tesla-t4", "nvidia-tesla-p100", "nvidia-l4"),
}

_PD = ("pd-standard", "pd-balanced", "pd-ssd")
_HD = ("hyperdisk-balanced", "hyperdisk-extreme", "hyperdisk-throughput")
# Machine family -> the disk types its VMs can attach.
DISK_TYPES: dict[str, tuple[str, ...]] = {
    "e2": _PD,
    "n1": _PD,
    "n2": (*_PD, "pd-extreme"),
    "g2": ("pd-balanced", "pd-ssd"),
    "a2": _PD,
    "a3": ("pd-balanced", "pd-ssd", *_HD),
    "c3": ("pd-balanced", "pd-ssd", *_HD),
    "n4": ("hyperdisk-balanced",),
}


def family(machine_type: str) -> str:
    return machine_type.split("-", 1)[0]


# -- images ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Image:
    project: str
    name: str
    family: str
    disk_gb: int


# Public images (the newest of each family), with their sizes: a boot disk
# smaller than its image is refused.
IMAGES: tuple[Image, ...] = (
    Image("debian-cloud", "debian-12-bookworm-v20251111", "debian-12", 10),
    Image("debian-cloud", "debian-11-bullseye-v20251111", "debian-11", 10),
    Image("ubuntu-os-cloud", "ubuntu-2204-jammy-v20251111", "ubuntu-2204-lts", 10),
    Image("deeplearning-platform-release", "common-cu124-v20251111-debian-11",
          "common-cu124-debian-11", 50),
    Image("deeplearning-platform-release", "tf-2-21-cu124-v20251111-debian-11",
          "tf-2-21-cu124-debian-11", 50),
)


def image_resource(image: Image) -> dict[str, Any]:
    base = "https://www.googleapis.com/compute/v1"
    return {
        "kind": "compute#image",
        "id": str(abs(hash((image.project, image.name))) % 10**18 + 10**18),
        "name": image.name,
        "family": image.family,
        "diskSizeGb": str(image.disk_gb),
        "archiveSizeBytes": str(image.disk_gb * 2**28),
        "status": "READY",
        "sourceType": "RAW",
        "architecture": "X86_64",
        "selfLink": f"{base}/projects/{image.project}/global/images/{image.name}",
    }


_IMAGE_PATH = re.compile(
    r"^(?:https://[^/]+/compute/v1/)?(?:projects/(?P<project>[^/]+)/)?global/images/"
    r"(?:family/(?P<family>[^/]+)|(?P<name>[^/]+))$"
)


def find_image(project: str, source: str) -> Image:
    """The image a ``sourceImage`` names; Refusal 404 when there is none."""
    match = _IMAGE_PATH.match(source)
    if match is None:
        raise Refusal(
            400,
            f"Invalid value for field 'resource.disks[0].initializeParams.sourceImage': "
            f"'{source}'. The URL is malformed.",
            "invalid",
        )
    owner = match["project"] or project
    for image in IMAGES:
        if image.project != owner:
            continue
        if match["family"] == image.family or match["name"] == image.name:
            return image
    what = f"family/{match['family']}" if match["family"] else match["name"]
    raise Refusal(
        404, f"The resource 'projects/{owner}/global/images/{what}' was not found", "notFound"
    )


# -- networks ----------------------------------------------------------------------------


@dataclass
class Network:
    name: str
    auto: bool  # auto mode: one subnetwork named like the network in every region
    subnets: dict[str, list[str]] = field(default_factory=dict)  # region -> names

    def has_subnet(self, region: str, name: str) -> bool:
        return name in self.subnets.get(region, [])


def default_network(regions: Iterable[str]) -> Network:
    return Network("default", True, {r: ["default"] for r in sorted(set(regions))})


def network_resource(project: str, net: Network) -> dict[str, Any]:
    base = f"https://www.googleapis.com/compute/v1/projects/{project}"
    return {
        "kind": "compute#network",
        "id": str(abs(hash((project, net.name))) % 10**18 + 10**18),
        "name": net.name,
        "autoCreateSubnetworks": net.auto,
        "routingConfig": {"routingMode": "REGIONAL"},
        "subnetworks": [
            f"{base}/regions/{region}/subnetworks/{name}"
            for region, names in sorted(net.subnets.items())
            for name in names
        ],
        "selfLink": f"{base}/global/networks/{net.name}",
    }


def default_firewalls(project: str) -> list[dict[str, Any]]:
    """The rules GCE makes with the `default` network, at priority 65534."""
    base = f"https://www.googleapis.com/compute/v1/projects/{project}"
    rules = [
        ("default-allow-internal", ["10.128.0.0/9"],
         [{"IPProtocol": "tcp", "ports": ["0-65535"]}, {"IPProtocol": "udp",
          "ports": ["0-65535"]}, {"IPProtocol": "icmp"}]),
        ("default-allow-ssh", ["0.0.0.0/0"], [{"IPProtocol": "tcp", "ports": ["22"]}]),
        ("default-allow-rdp", ["0.0.0.0/0"], [{"IPProtocol": "tcp", "ports": ["3389"]}]),
        ("default-allow-icmp", ["0.0.0.0/0"], [{"IPProtocol": "icmp"}]),
    ]
    return [
        {
            "kind": "compute#firewall",
            "id": str(10**18 + index),
            "creationTimestamp": "2020-01-01T00:00:00.000-07:00",
            "name": name,
            "description": "",
            "network": f"{base}/global/networks/default",
            "priority": 65534,
            "direction": "INGRESS",
            "logConfig": {"enable": False},
            "disabled": False,
            "selfLink": f"{base}/global/firewalls/{name}",
            "allowed": allowed,
            "sourceRanges": ranges,
        }
        for index, (name, ranges, allowed) in enumerate(rules)
    ]


# -- insert checks ----------------------------------------------------------------------


def check_machine_and_gpus(zone: str, machine: str, accelerators: Sequence[Mapping[str, Any]],
                           project: str) -> None:
    """The machine type in the zone, and the GPUs it may carry."""
    if machine not in MACHINE_TYPES.get(zone, ()):
        raise Refusal(
            400,
            f"Invalid value for field 'resource.machineType': 'zones/{zone}/machineTypes/"
            f"{machine}'. Machine type with name '{machine}' does not exist in zone '{zone}'.",
            "invalid",
        )
    for index, acc in enumerate(accelerators):
        url = str(acc.get("acceleratorType") or "")
        kind = url.rstrip("/").rsplit("/", 1)[-1]
        count = int(acc.get("acceleratorCount") or 0)
        where = f"resource.guestAccelerators[{index}]"
        if kind not in ACCELERATOR_TYPES.get(zone, ()):
            # A GPU this zone does not offer is a missing resource: "googleapi:
            # Error 400: The resource 'projects/ci-test-project-188019/zones/
            # us-central1-f/acceleratorTypes/nvidia-tesla-k80' was not found,
            # badRequest" (hashicorp/terraform-provider-google#5860; gcloud
            # prints the same text, fastai/course-v3#430).
            raise Refusal(
                400,
                f"The resource 'projects/{project}/zones/{zone}/acceleratorTypes/{kind}' was "
                "not found",
                "badRequest",
            )
        if machine in BUILTIN_GPUS or kind not in ATTACHABLE_GPUS or family(machine) != "n1":
            # "[nvidia-tesla-a100, n1-highmem-8] features are not compatible for
            # creating instance." (400 badRequest, skypilot-org/skypilot#212).
            # A G2/A2/A3 type given guest accelerators is refused with it too
            # (tfcluster never sends them; not seen in a report).
            raise Refusal(
                400,
                f"[{kind}, {machine}] features are not compatible for creating instance.",
                "badRequest",
            )
        if count not in ATTACHABLE_GPUS[kind]:
            raise Refusal(
                400,
                f"Invalid value for field '{where}.acceleratorCount': '{count}'. Accelerator "
                f"count must be one of {list(ATTACHABLE_GPUS[kind])} for '{kind}'.",
                "invalid",
            )


def check_boot_disk(project: str, zone: str, machine: str, init: Mapping[str, Any]) -> Image:
    """The image exists, the disk is at least its size, the type fits the family."""
    image = find_image(project, str(init.get("sourceImage") or ""))
    size = int(init.get("diskSizeGb") or image.disk_gb)
    if size < image.disk_gb:
        raise Refusal(
            400,
            f"Invalid value for field 'resource.disks[0].initializeParams.diskSizeGb': "
            f"'{size}'. Requested disk size cannot be smaller than the image size "
            f"({image.disk_gb} GB)",
            "invalid",
        )
    disk_type = str(init.get("diskType") or "pd-standard").rstrip("/").rsplit("/", 1)[-1]
    allowed = DISK_TYPES.get(family(machine))
    if allowed is not None and disk_type not in allowed:
        raise Refusal(
            400,
            f"Invalid value for field 'resource.disks[0].initializeParams.diskType': "
            f"'{disk_type}'. [{disk_type}] features are not compatible for creating instance "
            f"of machine type '{machine}'.",
            "invalid",
        )
    return image


_SUBNET = re.compile(r"regions/(?P<region>[^/]+)/subnetworks/(?P<name>[^/]+)$")


def check_nic(
    project: str,
    zone: str,
    nic: Mapping[str, Any],
    index: int,
    networks: Callable[[str], Mapping[str, Network]],
) -> None:
    """The network exists (in its own project: a Shared VPC's host); a
    custom-mode one needs a subnetwork of the zone's region."""
    net_path = str(nic.get("network") or "global/networks/default")
    owner = project
    if match := re.search(r"projects/([^/]+)/global/networks/", net_path):
        owner = match[1]
    name = net_path.rstrip("/").rsplit("/", 1)[-1]
    net = networks(owner).get(name)
    if net is None:
        raise Refusal(
            404, f"The resource 'projects/{owner}/global/networks/{name}' was not found",
            "notFound",
        )
    region = zone.rsplit("-", 1)[0]
    field_name = f"resource.networkInterfaces[{index}].subnetwork"
    subnet = nic.get("subnetwork")
    if not subnet:
        if not net.auto:
            raise Refusal(
                400,
                f"Invalid value for field '{field_name}': ''. Subnetwork should be specified "
                "for custom subnetmode network",
                "invalid",
            )
        return
    match = _SUBNET.search(str(subnet))
    sub_region, sub_name = (match["region"], match["name"]) if match else (region, str(subnet))
    if sub_region != region:
        raise Refusal(
            400,
            f"Invalid value for field '{field_name}': '{subnet}'. Subnetwork must be in the "
            f"same region as the instance ({region}).",
            "invalid",
        )
    if not net.has_subnet(region, sub_name):
        raise Refusal(
            404,
            f"The resource 'projects/{owner}/regions/{region}/subnetworks/{sub_name}' was "
            "not found",
            "notFound",
        )


def check_firewall_network(
    project: str, body: Mapping[str, Any], networks: Mapping[str, Network]
) -> None:
    """A rule is for a network of its own project (a Shared VPC's rules are
    made in the host project), and that network exists."""
    net_path = str(body.get("network") or "global/networks/default")
    match = re.search(r"projects/([^/]+)/global/networks/", net_path)
    if match and match[1] != project:
        raise Refusal(
            400,
            f"Invalid value for field 'resource.network': '{net_path}'. Cross project "
            "referencing is not allowed for this resource.",
            "invalid",
        )
    name = net_path.rstrip("/").rsplit("/", 1)[-1]
    if name not in networks:
        raise Refusal(
            404, f"The resource 'projects/{project}/global/networks/{name}' was not found",
            "notFound",
        )


# -- who may connect ----------------------------------------------------------------------


def _port_in(rule_ports: Sequence[str] | None, port: int) -> bool:
    if not rule_ports:
        return True  # a protocol with no ports: all of them
    for spec in rule_ports:
        low, _, high = str(spec).partition("-")
        if int(low) <= port <= int(high or low):
            return True
    return False


def _matches(entries: Sequence[Mapping[str, Any]], port: int) -> bool:
    return any(
        e.get("IPProtocol") in ("tcp", "all") and _port_in(e.get("ports"), port) for e in entries
    )


def ingress_allowed(
    rules: Iterable[Mapping[str, Any]],
    *,
    network: str,
    target_tags: Sequence[str],
    port: int,
    source_ip: str,
    source_tags: Sequence[str] = (),
) -> bool:
    """Whether a TCP connection from ``source_ip`` (an instance with
    ``source_tags``, or an outside address) reaches ``port`` of a VM with
    ``target_tags`` on ``network``: the matching rule of the lowest priority
    number wins, a deny before an allow of the same priority; no match is
    GCE's implied deny-all ingress."""
    address = ipaddress.ip_address(source_ip)
    matching = []
    for rule in rules:
        if rule.get("disabled") or rule.get("direction", "INGRESS") != "INGRESS":
            continue
        if str(rule.get("network", "")).rsplit("/", 1)[-1] != network:
            continue
        targets = rule.get("targetTags") or []
        if targets and not set(targets) & set(target_tags):
            continue
        by_range = any(
            address in ipaddress.ip_network(r, strict=False) for r in rule.get("sourceRanges") or []
        )
        by_tag = bool(set(rule.get("sourceTags") or []) & set(source_tags))
        if not (by_range or by_tag):
            continue
        if rule.get("denied") and _matches(rule["denied"], port):
            matching.append((int(rule.get("priority", 1000)), 0, False))
        elif rule.get("allowed") and _matches(rule["allowed"], port):
            matching.append((int(rule.get("priority", 1000)), 1, True))
    if not matching:
        return False
    return min(matching)[2]
