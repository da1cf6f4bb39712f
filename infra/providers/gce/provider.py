"""``GceProvider``: the Compute Engine provider, composed of its parts.

Each part is one idea (``api`` the clients, retries and operations;
``nodes`` listing and keeping labels in sync; ``instances`` create with zone
failover, start, stop, delete; ``firewall`` the rules; ``project`` the
checks against the project; ``pricing`` the cost, as ``base.Pricing``).
This class adds what joins them: ``prepare`` (the rules and the nodes' key),
how commands reach the nodes, and what they can do (``capabilities``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from infra.config.loader import ClusterConfig
from infra.config.storage import NodeIdentity
from infra.errors import ConfigError, StateError
from infra.providers.base import Capabilities, Node, login_key
from infra.providers.gce import checks, identity
from infra.providers.gce.config import GceConfig, gce_config
from infra.providers.gce.firewall import GceFirewall
from infra.providers.gce.instances import GceInstances
from infra.providers.gce.pricing.estimates import GcePricing
from infra.providers.gce.project import GceProject
from infra.state.folder import ClusterState

if TYPE_CHECKING:
    from infra.transport.base import Transport

log = logging.getLogger("tfcluster")


class GceProvider(GceInstances, GceFirewall, GceProject, GcePricing):
    """Compute Engine instances labelled ``tfcluster-cluster=<name>``."""

    kind = "gce"
    config_section = GceConfig

    def __init__(self, config: ClusterConfig, state: ClusterState) -> None:
        super().__init__(config, state)
        self._check_labels()

    def prepare(self) -> None:
        """The SSH key, the firewall rules, and the key and labels on any
        existing node (a lost state folder means a new key: re-install it)."""
        _, public_key = login_key(self.config, self.state)
        if self._ssh_open_to_all():
            log.warning(
                "SSH to the nodes is open to the whole internet (gce.ssh_source_ranges: %s); "
                "set it to your own address range",
                ", ".join(self.gce.ssh_source_ranges),
            )
        rules = self._firewall_rules()
        with self._api_errors("preparing the cluster"):
            # What real GCE would refuse at insert, refused before any change.
            self.check_config()
            _, errors = self._parallel(lambda name: self._ensure_firewall(rules[name]), list(rules))
            self._raise_errors(errors, "firewall rules")
            if self.ssh_deny_rule not in rules:
                # SSH is now open to all: a deny from an earlier `up` would block it.
                op = self._delete_firewall(self.ssh_deny_rule)
                if op is not None:
                    self._wait_operation(op, zone=None, what=f"delete {self.ssh_deny_rule}")
            # `up` listed the nodes to plan: that listing, not another.
            self._sync_nodes(self._instances_as_listed(keep=True), public_key)

    def check_owner(self) -> None:
        """Nodes and rules of this name that another state made (another
        person's cluster of the shipped name in one project) are refused,
        before `up` would take them over and replace their ``ssh-keys``."""
        with self._api_errors(f"listing what {self.config.name} has in the project"):
            if self._listed is None:  # `up`'s plan listed them just before
                self._instances()
            found = {**self.foreign, **self.foreign_rules()}
        if found:
            raise self.not_ours(found)

    def transport(self, nodes: Sequence[Node]) -> Transport:
        # Imported here: the SSH stack is not needed to list or create nodes.
        from infra.transport.ssh import SshTarget, SshTransport

        key_file, _ = login_key(self.config, self.state)
        unreachable = [n.name for n in nodes if not (n.ssh_host or n.external_ip)]
        if unreachable:
            raise StateError(
                f"{', '.join(unreachable)} has no external IP (not running?); "
                "run `deploy.py up` first"
            )
        targets = [
            SshTarget(n.name, cast(str, n.ssh_host or n.external_ip), n.ssh_port) for n in nodes
        ]
        by_name = {n.name: n for n in nodes}
        return SshTransport(
            targets,
            config=self.config,
            state=self.state,
            key_file=key_file,
            host_keys=lambda name: self.host_keys(by_name[name]),
            auth_hint=self._auth_hint,
        )

    def capabilities(self) -> Capabilities:
        return Capabilities(
            # A guest shutdown leaves the instance TERMINATED: disks kept, no
            # compute billed, and the node needs no credentials to do it.
            cannot_self_stop=None,
            # An external IP goes back to Google's pool on stop or delete.
            ephemeral_addresses=True,
            # The service account of gce.service_account, from the metadata server.
            nodes_have_identity=True,
            operation_timeout=self.gce.operation_timeout,
        )

    @classmethod
    def gpus_per_node(cls, config: ClusterConfig) -> int:
        """gce.accelerator's, or those of a G2/A2/A3 machine type."""
        found = checks.gpus(gce_config(config))
        return found[1] if found else 0

    @classmethod
    def secret_files(cls, config: ClusterConfig) -> list[str]:
        credentials = gce_config(config).credentials
        return [] if credentials in ("adc", "anonymous") else [credentials]

    def bucket_identity(self) -> NodeIdentity:
        """The nodes' service account; refused when gce.scopes keep its
        tokens from writing objects."""
        gce = self.gce
        if not identity.can_write_storage(gce.scopes):
            raise ConfigError(
                f"{self.config.source}: gce.scopes: {', '.join(gce.scopes)} cannot write to "
                "the cluster's bucket (storage.bucket); add storage-rw (or cloud-platform)"
            )
        if gce.service_account != "default":
            return NodeIdentity(gce.service_account, self.api.project)
        with self._api_errors("reading the project's default service account"):
            email = self._default_service_account()
        return NodeIdentity(email, self.api.project, default_account=True)

    def task_env(self) -> dict[str, str]:
        # A node billed for GPUs must train on them: the trainer refuses to
        # start (one line, exit 7) when TensorFlow sees none, instead of a
        # silent CPU run on a GPU bill. A user's own program can read it too.
        return {"TFCLUSTER_REQUIRE_GPU": "1"} if checks.gpus(self.gce) else {}
