"""cluster.yaml's ``gce`` section: the Compute Engine settings of provider
gce (``GceProvider.config_section``).

infra/config/loader.py adds it to the file's keys when the file names provider gce
or has a ``gce`` key, as it does a plug-in's section; a local cluster's
validation never loads this package. Only pydantic here: the registry may
import this package to ask what a file says, without Google's client.
"""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator

from infra.config.base import Strict, show
from infra.providers.gce.identity import (
    DEFAULT_SCOPES,
    scope_urls,
    service_account_problem,
)

if TYPE_CHECKING:
    from infra.config.loader import ClusterConfig

_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]\Z")


class Accelerator(Strict):
    """GPUs per node (GCE guestAccelerators)."""

    type: str  # for example nvidia-tesla-t4, nvidia-l4
    count: Annotated[int, Field(ge=1, le=8)] = 1


class GceConfig(Strict):
    """Compute Engine settings (provider: gce)."""

    # Project id; default: $GOOGLE_CLOUD_PROJECT, then the ADC project.
    project: str | None = None
    # Ordered: the first zone is preferred, the rest are tried on stockout or quota.
    zones: list[str] = ["us-central1-a", "us-central1-b", "us-central1-f"]
    # 2 vCPU / 8 GB: TensorFlow plus a ps or worker fit with room to spare.
    machine_type: str = "e2-standard-2"
    # A family resolves to the newest image of that family at create time.
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    # Boot disk, GB; None = 20, or the image's own size when larger (a Deep
    # Learning VM image is about 50 GB; GCE refuses a disk smaller than its image).
    disk_gb: Annotated[int, Field(ge=10, le=65536)] | None = None
    disk_type: str = "pd-balanced"
    # Spot VMs: far cheaper, may be stopped by GCE at any time (`up` restarts them).
    preemptible: bool = False
    network: str = "default"
    subnetwork: str | None = None
    # Who may reach SSH (port 22). Narrow this to your own address/32.
    ssh_source_ranges: list[str] = ["0.0.0.0/0"]
    # Compute API endpoint; None = Google's. Emulators and tests set http://127.0.0.1:PORT.
    api_endpoint: str | None = None
    # "adc" (gcloud auth application-default login), "anonymous" (emulators only),
    # or the path of a service-account JSON key file.
    credentials: str = "adc"
    accelerator: Accelerator | None = None
    # Upper bound, seconds, on waiting for any one Compute operation.
    operation_timeout: Annotated[float, Field(gt=0)] = 600.0
    # Extra labels on every instance (cost attribution).
    labels: dict[str, str] = {}
    # Extra instance metadata (for example install-nvidia-driver: "True"); the
    # keys tfcluster sets itself (ssh-keys, enable-oslogin, ...) are refused.
    metadata: dict[str, str] = {}
    # What `stop` does with the Local SSD that A2 Ultra and A3 machine types
    # come with (GCE refuses to stop them without being told): keep its data
    # (saved by GCE and billed while stopped) or discard it. Other machine
    # types have none and ignore this.
    local_ssd_on_stop: Literal["keep", "discard"] = "keep"
    # The nodes' identity (infra/providers/gce/identity.py): "default" (the
    # project's default compute service account) or a service account's email.
    service_account: str = "default"
    # What its tokens may do: gcloud's aliases (storage-rw, cloud-platform, ...)
    # or scope URLs. Default: read/write Cloud Storage only.
    scopes: list[str] = list(DEFAULT_SCOPES)

    @field_validator("zones")
    @classmethod
    def _zones(cls, zones: list[str]) -> list[str]:
        if not zones:
            raise ValueError("list at least one zone, for example [us-central1-a]")
        for zone in zones:
            if not _ZONE.match(zone):
                raise ValueError(f"{show(zone)} is not a zone name; zones look like us-central1-a")
        if len(set(zones)) != len(zones):
            raise ValueError("a zone is listed twice")
        return zones

    @field_validator("ssh_source_ranges")
    @classmethod
    def _ranges(cls, ranges: list[str]) -> list[str]:
        for cidr in ranges:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(
                    f"{show(cidr)} is not a CIDR range such as 203.0.113.7/32"
                ) from None
        return ranges

    @field_validator("service_account")
    @classmethod
    def _service_account(cls, value: str) -> str:
        if (problem := service_account_problem(value)) is not None:
            raise ValueError(problem)
        return value

    @field_validator("scopes")
    @classmethod
    def _scopes(cls, scopes: list[str]) -> list[str]:
        if not scopes:
            raise ValueError("list at least one scope, for example [storage-rw]")
        scope_urls(scopes)  # ValueError naming an unknown one
        return scopes

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not re.match(r"^https?://[^/]+", endpoint):
            raise ValueError(f"{show(endpoint)} is not a URL such as http://127.0.0.1:8089")
        return endpoint


def gce_config(config: ClusterConfig) -> GceConfig:
    """The cluster's ``gce`` section; its defaults when the file leaves it out."""
    section = getattr(config, "gce", None)
    return section if isinstance(section, GceConfig) else GceConfig()
