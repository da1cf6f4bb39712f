"""What cluster.yaml asks of the project, checked before anything is
created: labels GCE would refuse, the static checks (``checks.py``), and
those that read the API (the image, the network, OS Login)."""

from __future__ import annotations

import logging
import re

from infra.config.loader import in_file
from infra.errors import ConfigError, TfclusterError
from infra.providers.gce import checks
from infra.providers.gce._google import api_exceptions, compute_v1
from infra.providers.gce.api import _CALL_TIMEOUT_S, GceApi, _last, _retried
from infra.providers.gce.nodes import CLUSTER_LABEL, ID_LABEL, RESERVED_METADATA, ROLE_LABEL

log = logging.getLogger("tfcluster")

_LABEL_KEY = re.compile(r"^[a-z][a-z0-9_-]{0,62}\Z")

_LABEL_VALUE = re.compile(r"^[a-z0-9_-]{0,63}\Z")


class GceProject(GceApi):
    """Checks cluster.yaml against the rules of GCE and the project."""

    def _check_labels(self) -> None:
        # GCE would refuse these only at create time, after the firewall
        # rules exist; a bad label is a cluster.yaml mistake: say so first.
        with in_file(self.config):
            for key, value in self.gce.labels.items():
                if key in (CLUSTER_LABEL, ID_LABEL, ROLE_LABEL):
                    raise ConfigError(
                        f"gce.labels: {key} is tfcluster's own label; use another key"
                    )
                if not _LABEL_KEY.match(key):
                    raise ConfigError(
                        f"gce.labels: {key!r} is not a valid GCE label key: lowercase letters, "
                        "digits, '_' and '-', starting with a letter, at most 63 characters"
                    )
                if not isinstance(value, str) or not _LABEL_VALUE.match(value):
                    raise ConfigError(
                        f"gce.labels.{key}: {value!r} is not a valid GCE label value: lowercase "
                        "letters, digits, '_' and '-', at most 63 characters"
                    )

    def check_config(self) -> None:
        # Only on the way up (`up`, `up --dry-run`, prepare): `down`, `stop`
        # and `status` must work whatever cluster.yaml says now. The static
        # checks first: they need no credentials. Once per provider, that
        # is per command (`up` plans, plans again under the lock, prepares).
        if self._config_checked:
            return
        with in_file(self.config):
            checks.check_config(self.gce, reserved_metadata=RESERVED_METADATA)
            with self._api_errors("checking cluster.yaml against the project"):
                self.check_plan()
        self._config_checked = True

    def check_plan(self) -> None:
        """The checks that read the API (the image, the network, the
        project's OS Login setting); ConfigError on a problem, before
        anything is created."""
        ref = checks.parse_image(self.gce.image)
        image = self._get_image(ref)
        if image is None:
            raise ConfigError(
                f"gce.image: {ref.text(self.api.project)} does not exist (or this account "
                "cannot read it); list images with `gcloud compute images list`"
            )
        self._image_gb = int(image.disk_size_gb or 0) or None
        if self._image_gb:
            checks.check_image_size(self.gce, self.gce.image, self._image_gb)
        network_path = self._network()
        project = self.api.project
        if network_path.startswith("projects/"):
            project = network_path.split("/")[1]
        network = self._get_network(project, _last(network_path))
        if network is None:
            raise ConfigError(
                f"gce.network: {self.gce.network} does not exist in project {project}; "
                "`gcloud compute networks list` shows the networks"
            )
        # Custom mode: autoCreateSubnetworks false. A legacy network (an
        # IPv4Range, no subnetworks) takes no subnetwork.
        custom = not network.auto_create_subnetworks and not network.I_pv4_range
        checks.check_subnetwork(self.gce, self.gce.network, custom, list(network.subnetworks))
        try:
            self._oslogin = checks.oslogin_enforced(self._project_metadata())
        except api_exceptions.Forbidden:
            self._oslogin = False  # may not read the project: SSH itself will tell
        if self._oslogin:
            log.warning("%s", checks.OSLOGIN_HINT)

    @_retried("read image {ref}", mutates=False)
    def _get_image(self, ref: checks.ImageRef) -> compute_v1.Image | None:
        project = ref.project or self.api.project
        try:
            if ref.family:
                return self.api.images.get_from_family(
                    project=project, family=ref.family, retry=None, timeout=_CALL_TIMEOUT_S
                )
            return self.api.images.get(
                project=project, image=str(ref.image), retry=None, timeout=_CALL_TIMEOUT_S
            )
        except api_exceptions.NotFound:
            return None

    @_retried("read network {name}", mutates=False)
    def _get_network(self, project: str, name: str) -> compute_v1.Network | None:
        try:
            return self.api.networks.get(
                project=project, network=name, retry=None, timeout=_CALL_TIMEOUT_S
            )
        except api_exceptions.NotFound:
            return None

    @_retried("read the metadata of project {self.api.project}", mutates=False)
    def _project_metadata(self) -> dict[str, str]:
        project = self.api.projects.get(
            project=self.api.project, retry=None, timeout=_CALL_TIMEOUT_S
        )
        return {i.key: i.value for i in project.common_instance_metadata.items}

    @_retried("read the default service account of project {self.api.project}", mutates=False)
    def _default_service_account(self) -> str:
        project = self.api.projects.get(
            project=self.api.project, retry=None, timeout=_CALL_TIMEOUT_S
        )
        return str(project.default_service_account)

    def _auth_hint(self) -> str | None:
        """Why the nodes refused the cluster's key: OS Login enforced on the
        project is the usual cause on GCE (instance metadata enable-oslogin=
        FALSE does not win over an organisation policy)."""
        try:
            with self._api_errors("reading the project metadata"):
                enforced = checks.oslogin_enforced(self._project_metadata())
        except TfclusterError:
            enforced = False
        if enforced:
            return checks.OSLOGIN_HINT
        return (
            "if an organisation policy enforces OS Login (compute.requireOsLogin), the VMs "
            "ignore tfcluster's ssh-keys metadata: have it lifted for this project"
        )
