"""The body of an ``instances.insert`` checked as GCE checks it, and the
instance resource the fake stores from it (``instance_resource``): its
name, machine type, boot disk, network interfaces, labels (``check_labels``,
also for ``setLabels``), scheduling (Spot, host maintenance with GPUs), the
Local SSD and GPUs its machine type comes with, its service accounts.

What a zone offers (machine types, GPUs, images, networks) is catalog.py's;
who the service accounts are is identity.py's.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tests.fake_gce import catalog, identity
from tests.fake_gce.api import (
    API_ROOT,
    NAME,
    ApiError,
    fingerprint,
    last,
    network_url,
    now,
    resource_id,
)

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}$")

# A project -> its networks (projects.py), for the checks of a network interface.
Networks = Callable[[str], dict[str, catalog.Network]]


def instance_resource(project: str, zone: str, body: Any, networks: Networks) -> dict[str, Any]:
    """Validate an insert body as GCE would; return the stored resource."""
    if not isinstance(body, dict):
        raise ApiError(400, "Required field 'resource' not specified", "required")
    name = _checked_name(body)
    machine_name = _checked_machine(zone, body)
    boot, init = _checked_boot_disk(body)
    nics = body.get("networkInterfaces") or []
    if not nics:
        raise ApiError(
            400, "Required field 'resource.networkInterfaces' not specified", "required"
        )
    # What the zone offers, the family allows, the image and network need.
    catalog.check_machine_and_gpus(
        zone, machine_name, body.get("guestAccelerators") or [], project
    )
    image_gb = 10
    if init.get("sourceImage"):
        image_gb = catalog.check_boot_disk(project, zone, machine_name, init).disk_gb
    for index, nic in enumerate(nics):
        catalog.check_nic(project, zone, nic, index, networks)
    labels = dict(body.get("labels") or {})
    check_labels(labels)
    scheduling = _scheduling(body, machine_name)
    resource = _resource(project, zone, body, name, machine_name, labels, scheduling)
    zone_url = resource["zone"]
    resource["disks"].append(_boot_disk(zone, zone_url, name, boot, init, image_gb))
    resource["disks"].extend(_local_ssds(machine_name))
    gpus = _gpus(zone_url, machine_name, body.get("guestAccelerators") or [])
    if gpus:
        resource["guestAccelerators"] = gpus
    accounts = identity.service_accounts(project, body.get("serviceAccounts"))
    if accounts:
        resource["serviceAccounts"] = accounts
    return resource


def check_labels(labels: Mapping[str, Any]) -> None:
    if len(labels) > 64:
        raise ApiError(400, "Too many labels (at most 64)", "invalid")
    for key, value in labels.items():
        if not _LABEL_KEY.match(str(key)):
            raise ApiError(
                400, f"Invalid value for field 'labels': key '{key}' is not a valid label key",
                "invalid",
            )
        if not isinstance(value, str) or not _LABEL_VALUE.match(value):
            raise ApiError(
                400,
                f"Invalid value for field 'labels': value '{value}' of label '{key}' is not "
                "valid; use lowercase letters, digits, '_' and '-'",
                "invalid",
            )


def nic(project: str, zone: str, given: Mapping[str, Any], index: int) -> dict[str, Any]:
    """A network interface as the instance shows it, from the one given."""
    region = zone.rsplit("-", 1)[0]
    subnetwork = given.get("subnetwork")
    if subnetwork and not subnetwork.startswith("https://"):
        if subnetwork.startswith("projects/"):
            subnetwork = f"{API_ROOT}/{subnetwork}"
        else:
            if "/" not in subnetwork:
                subnetwork = f"regions/{region}/subnetworks/{subnetwork}"
            subnetwork = f"{API_ROOT}/projects/{project}/{subnetwork}"
    network = network_url(project, given.get("network"))
    out: dict[str, Any] = {
        "kind": "compute#networkInterface",
        "name": f"nic{index}",
        "network": network,
        "subnetwork": subnetwork
        or f"{API_ROOT}/projects/{project}/regions/{region}/subnetworks/{last(network)}",
        "fingerprint": fingerprint([index, network]),
        "stackType": "IPV4_ONLY",
    }
    accesses = []
    for access in given.get("accessConfigs") or []:
        entry = {
            "kind": "compute#accessConfig",
            "type": access.get("type", "ONE_TO_ONE_NAT"),
            "name": access.get("name", "External NAT"),
            "networkTier": access.get("networkTier", "PREMIUM"),
        }
        if access.get("natIP"):
            # A reserved static address stays through stop and start.
            entry["x-fake-static"] = access["natIP"]
        accesses.append(entry)
    if accesses:
        out["accessConfigs"] = accesses
    return out


# -- the checks, in GCE's order -------------------------------------------------------


def _checked_name(body: Mapping[str, Any]) -> Any:
    name = body.get("name")
    if not name:
        raise ApiError(400, "Required field 'resource.name' not specified", "required")
    if not NAME.match(name):
        raise ApiError(
            400,
            f"Invalid value for field 'resource.name': '{name}'. Must be a match of regex "
            "'(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
            "invalid",
        )
    return name


def _checked_machine(zone: str, body: Mapping[str, Any]) -> str:
    """The machine type's name, if it looks like one."""
    machine = body.get("machineType")
    if not machine:
        raise ApiError(400, "Required field 'resource.machineType' not specified", "required")
    machine_name = last(machine)
    if not re.match(r"^[a-z][a-z0-9]*-[a-z0-9-]+$", machine_name):
        raise ApiError(
            400,
            f"Invalid value for field 'resource.machineType': '{machine}'. Machine type "
            f"with name '{machine_name}' does not exist in zone '{zone}'.",
            "invalid",
        )
    return machine_name


def _checked_boot_disk(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the one boot disk, its initializeParams)."""
    disks = body.get("disks") or []
    boot = [d for d in disks if d.get("boot")]
    if len(boot) != 1:
        raise ApiError(400, "Exactly one boot disk must be specified", "invalid")
    init = boot[0].get("initializeParams") or {}
    if not init.get("sourceImage") and not boot[0].get("source"):
        raise ApiError(
            400, "Required field 'resource.disks[0].initializeParams.sourceImage' not "
            "specified", "required",
        )
    return boot[0], init


def _scheduling(body: Mapping[str, Any], machine_name: str) -> dict[str, Any]:
    """The scheduling given over GCE's defaults; Spot VMs and GPUs terminate
    on host maintenance and Spot VMs never restart by themselves."""
    scheduling = {
        "onHostMaintenance": "MIGRATE",
        "automaticRestart": True,
        "preemptible": False,
        "provisioningModel": "STANDARD",
        **(body.get("scheduling") or {}),
    }
    spot = scheduling["provisioningModel"] == "SPOT" or scheduling["preemptible"]
    if spot:
        if "onHostMaintenance" not in (body.get("scheduling") or {}):
            scheduling["onHostMaintenance"] = "TERMINATE"
        if scheduling["automaticRestart"]:
            raise ApiError(
                400,
                "Invalid value for field 'resource.scheduling.automaticRestart': 'true'. "
                "Preemptible and Spot VMs do not support automatic restart.",
                "invalid",
            )
        if scheduling["onHostMaintenance"] != "TERMINATE":
            raise ApiError(
                400,
                "Invalid value for field 'resource.scheduling.onHostMaintenance': "
                f"'{scheduling['onHostMaintenance']}'. Spot VMs must terminate on host "
                "maintenance.",
                "invalid",
            )
    accelerators = body.get("guestAccelerators") or []
    builtin = catalog.BUILTIN_GPUS.get(machine_name)
    if (accelerators or builtin) and scheduling["onHostMaintenance"] != "TERMINATE":
        raise ApiError(
            400,
            "Invalid value for field 'resource.scheduling.onHostMaintenance': 'MIGRATE'. "
            "Instances with guest accelerators do not support live migration.",
            "invalid",
        )
    return scheduling


# -- the stored resource --------------------------------------------------------------


def _resource(
    project: str,
    zone: str,
    body: Mapping[str, Any],
    name: str,
    machine_name: str,
    labels: dict[str, Any],
    scheduling: dict[str, Any],
) -> dict[str, Any]:
    """The instance, PROVISIONING, with no disk yet."""
    metadata_items = list((body.get("metadata") or {}).get("items") or [])
    zone_url = f"{API_ROOT}/projects/{project}/zones/{zone}"
    tags = (body.get("tags") or {}).get("items") or []
    return {
        "kind": "compute#instance",
        "id": resource_id(),
        "creationTimestamp": now(),
        "name": name,
        "description": body.get("description", ""),
        "tags": {"items": list(tags), "fingerprint": fingerprint(tags)},
        "machineType": f"{zone_url}/machineTypes/{machine_name}",
        "status": "PROVISIONING",
        "zone": zone_url,
        "canIpForward": bool(body.get("canIpForward", False)),
        "networkInterfaces": [
            nic(project, zone, given, index)
            for index, given in enumerate(body.get("networkInterfaces") or [])
        ],
        "disks": [],
        "metadata": {
            "kind": "compute#metadata",
            "fingerprint": fingerprint(metadata_items),
            "items": metadata_items,
        },
        "selfLink": f"{zone_url}/instances/{name}",
        "scheduling": scheduling,
        "cpuPlatform": "Intel Broadwell",
        "labels": labels,
        "labelFingerprint": fingerprint(labels),
        "startRestricted": False,
        "deletionProtection": bool(body.get("deletionProtection", False)),
        "fingerprint": fingerprint(name),
    }


def _boot_disk(
    zone: str,
    zone_url: str,
    name: str,
    boot: Mapping[str, Any],
    init: Mapping[str, Any],
    image_gb: int,
) -> dict[str, Any]:
    disk_type = init.get("diskType") or f"zones/{zone}/diskTypes/pd-standard"
    return {
        "kind": "compute#attachedDisk",
        "type": "PERSISTENT",
        "mode": "READ_WRITE",
        "source": f"{zone_url}/disks/{init.get('diskName') or name}",
        "deviceName": boot.get("deviceName") or name,
        "index": 0,
        "boot": True,
        "autoDelete": bool(boot.get("autoDelete", False)),
        "interface": "SCSI",
        "diskSizeGb": str(init.get("diskSizeGb") or image_gb),
        # Not in the real attachedDisk; kept so tests can check the request.
        "x-fake-diskType": disk_type,
        "x-fake-sourceImage": init.get("sourceImage") or "",
    }


def _local_ssds(machine_name: str) -> list[dict[str, Any]]:
    """The Local SSD the machine type comes with, as GCE lists it."""
    return [
        {
            "kind": "compute#attachedDisk",
            "type": "SCRATCH",
            "mode": "READ_WRITE",
            "deviceName": f"local-ssd-{index}",
            "index": index + 1,
            "boot": False,
            "autoDelete": True,
            "interface": "NVME",
            "diskSizeGb": "375",
        }
        for index in range(catalog.LOCAL_SSD_DISKS.get(machine_name, 0))
    ]


def _gpus(zone_url: str, machine_name: str, accelerators: list[Any]) -> list[dict[str, Any]]:
    """The GPUs the instance lists: those given, else those its machine type
    comes with."""
    if accelerators:
        return [
            {
                "acceleratorType": f"{zone_url}/acceleratorTypes/"
                f"{last(a.get('acceleratorType'))}",
                "acceleratorCount": int(a.get("acceleratorCount") or 1),
            }
            for a in accelerators
        ]
    builtin = catalog.BUILTIN_GPUS.get(machine_name)
    if builtin:
        kind, count = builtin
        return [{"acceleratorType": f"{zone_url}/acceleratorTypes/{kind}",
                 "acceleratorCount": count}]
    return []
