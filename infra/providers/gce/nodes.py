"""The cluster's instances as nodes: listing them (by label, across the
whole project, so that a node in a zone no longer in ``gce.zones`` is still
found and deleted), the labels and metadata keys tfcluster keeps on them,
and the SSH host keys their guest agent publishes."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping

from infra.errors import ProviderError, StateError
from infra.providers.base import Node, NodeState
from infra.providers.gce import checks
from infra.providers.gce._google import api_exceptions, compute_v1
from infra.providers.gce.api import _CALL_TIMEOUT_S, GceApi, _last, _retried
from infra.transport.host_keys import HostKeys

log = logging.getLogger("tfcluster")

# The labels that say which cluster a node is of, and its roles. The name
# alone does not make a node ours: two people may keep the shipped name in
# one project. The id (``ClusterState.cluster_id``) does; a node without it
# was made before tfcluster set it, and is taken as ours (and labelled) only
# by a state older than its id (``ClusterState.adopts_unmarked``).
CLUSTER_LABEL = "tfcluster-cluster"
ID_LABEL = "tfcluster-id"
# What ``foreign`` says of a node of the name that carries no id.
UNMARKED = "none"
ROLE_LABEL = "tfcluster-role"


# Every status of compute_v1.Instance.Status. PENDING_STOP (a stop waiting
# for the guest to shut down) is on its way to TERMINATED like STOPPING;
# DEPROVISIONING (being deleted) too; PENDING (queued for resources) is
# on its way up.
_STATES = {
    "PROVISIONING": NodeState.PENDING,
    "STAGING": NodeState.PENDING,
    "PENDING": NodeState.PENDING,
    "REPAIRING": NodeState.PENDING,
    "RUNNING": NodeState.RUNNING,
    "STOPPING": NodeState.STOPPING,
    "PENDING_STOP": NodeState.STOPPING,
    "SUSPENDING": NodeState.STOPPING,
    "DEPROVISIONING": NodeState.STOPPING,
    "TERMINATED": NodeState.STOPPED,
    "STOPPED": NodeState.STOPPED,
    "SUSPENDED": NodeState.STOPPED,
}
# Statuses GCE refuses to start from; wait for them to end first.
_STOPPING_STATUSES = frozenset({"STOPPING", "PENDING_STOP", "SUSPENDING"})


# A host key's type and blob as the guest agent publishes them.
_KEY_TYPE = re.compile(r"^[a-z][a-z0-9@.-]{2,63}\Z")
_BASE64 = re.compile(r"^[A-Za-z0-9+/]{16,16384}={0,2}\Z")


# Metadata keys tfcluster sets on every node (gce.metadata may not).
RESERVED_METADATA = ("ssh-keys", "enable-oslogin", "enable-guest-attributes")


class GceNodes(GceApi):
    """Reads the cluster's instances; keeps their labels and keys in sync."""

    @_retried("list the instances of cluster {self.config.name}", mutates=False)
    def _list_cluster(self) -> list[compute_v1.Instance]:
        request = compute_v1.AggregatedListInstancesRequest(
            project=self.api.project, filter=f'labels.{CLUSTER_LABEL} = "{self.config.name}"'
        )
        found: list[compute_v1.Instance] = []
        pages = self.api.instances.aggregated_list(
            request=request, retry=None, timeout=_CALL_TIMEOUT_S
        )
        for _scope, scoped in pages:
            found.extend(scoped.instances)
        return found

    @_retried("list the instances of cluster {self.config.name} in {zone}", mutates=False)
    def _list_zone(self, zone: str) -> list[compute_v1.Instance]:
        request = compute_v1.ListInstancesRequest(
            project=self.api.project,
            zone=zone,
            filter=f'labels.{CLUSTER_LABEL} = "{self.config.name}"',
        )
        return list(self.api.instances.list(request=request, retry=None, timeout=_CALL_TIMEOUT_S))

    @_retried("get instance {name} in {zone}", mutates=False)
    def _get_instance(self, zone: str, name: str) -> compute_v1.Instance | None:
        try:
            return self.api.instances.get(
                project=self.api.project,
                zone=zone,
                instance=name,
                retry=None,
                timeout=_CALL_TIMEOUT_S,
            )
        except api_exceptions.NotFound:
            return None

    @_retried("set the labels of {name} in {zone}", mutates=True)
    def _set_labels(
        self, zone: str, name: str, labels: dict[str, str], fingerprint: str
    ) -> compute_v1.Operation:
        return self.api.instances.set_labels_unary(
            project=self.api.project,
            zone=zone,
            instance=name,
            instances_set_labels_request_resource=compute_v1.InstancesSetLabelsRequest(
                labels=labels, label_fingerprint=fingerprint
            ),
            retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("set the metadata of {name} in {zone}", mutates=True)
    def _set_metadata(
        self, zone: str, name: str, metadata: compute_v1.Metadata
    ) -> compute_v1.Operation:
        return self.api.instances.set_metadata_unary(
            project=self.api.project,
            zone=zone,
            instance=name,
            metadata_resource=metadata,
            retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("read the guest attributes of {name} in {zone}", mutates=False)
    def _guest_attributes(
        self, zone: str, name: str, path: str
    ) -> list[compute_v1.GuestAttributesEntry]:
        request = compute_v1.GetGuestAttributesInstanceRequest(
            project=self.api.project, zone=zone, instance=name, query_path=path
        )
        try:
            found = self.api.instances.get_guest_attributes(
                request=request, retry=None, timeout=_CALL_TIMEOUT_S
            )
        except api_exceptions.NotFound:
            return []  # nothing published under the path (yet)
        return list(found.query_value.items)

    def _ours(self, inst: compute_v1.Instance) -> bool:
        """Whether an instance of the cluster's name is this state's (its id
        label; none: made before tfcluster set one, ours only if this state
        is that old too)."""
        found = inst.labels.get(ID_LABEL)
        if found is None:
            return self.state.adopts_unmarked()
        return found == self.state.cluster_id()

    def not_ours(self, found: Mapping[str, str]) -> StateError:
        unmarked = sorted(n for n, owner in found.items() if owner == UNMARKED)
        if unmarked:
            return StateError(
                f"{', '.join(unmarked)} of cluster {self.config.name} in project "
                f"{self.api.project} were made by an older tfcluster, not from this state "
                f"({self.state.dir}); left alone: rename this cluster (name: in "
                f"{self.config.source})",
                hint="yours? run `up` where you made them, or label each: gcloud compute "
                f"instances add-labels NODE --labels={ID_LABEL}={self.state.cluster_id()} "
                "(firewall rules: add [tfcluster-id=...] to their description)",
            )
        ids = ", ".join(sorted(set(found.values())))
        return StateError(
            f"{', '.join(sorted(found))} of cluster {self.config.name} in project "
            f"{self.api.project} belong to another tfcluster state (tfcluster-id {ids}, not "
            f"{self.state.cluster_id()}); left alone: rename this cluster (name: in "
            f"{self.config.source})",
            hint=f"yours, from another machine or a lost ~/.tfcluster? copy {self.state.dir} "
            f'from there, or put "cluster_id": "{ids.split(", ")[0]}" in {self.state.file}',
        )

    def _instances(self) -> dict[str, list[compute_v1.Instance]]:
        """This cluster's instances by name (several only if one name exists
        in two zones, which a failed cleanup could leave). Those of another
        state of the same name are left out (``foreign`` has them)."""
        by_name: dict[str, list[compute_v1.Instance]] = {}
        self.foreign = {}
        for inst in self._list_cluster():
            if not self._ours(inst):
                self.foreign[inst.name] = inst.labels.get(ID_LABEL, UNMARKED)
                continue
            by_name.setdefault(inst.name, []).append(inst)
        for name, found in by_name.items():
            if len(found) > 1 and name not in self._warned:
                self._warned.add(name)  # once, not on every poll
                log.warning(
                    "%s exists in %s; `deploy.py down` deletes all of them",
                    name,
                    ", ".join(_last(i.zone) for i in found),
                )
        self._listed = by_name
        return by_name

    def _instances_as_listed(self, *, keep: bool = False) -> dict[str, list[compute_v1.Instance]]:
        """The listing this command has just made, when nothing changed
        since (``_listed``); else a new one. Used once unless ``keep``
        (a step that changes instances forgets it anyway)."""
        listed = self._listed if self._listed is not None else self._instances()
        if not keep:
            self._listed = None
        return listed

    def non_terminated_nodes(self) -> list[Node]:
        with self._api_errors(f"listing the nodes of {self.config.name}"):
            instances = self._instances()
        order = {name: i for i, name in enumerate(self.config.nodes)}
        nodes = [self._node(found[0]) for found in instances.values()]
        return sorted(nodes, key=lambda n: (order.get(n.name, len(order)), n.name))

    def _node(self, inst: compute_v1.Instance) -> Node:
        boot = next((d for d in inst.disks if d.boot), None)
        if boot is not None and boot.disk_size_gb:
            self._disk_gb[inst.name] = int(boot.disk_size_gb)
        nic = inst.network_interfaces[0] if inst.network_interfaces else None
        internal = (nic.network_i_p or None) if nic else None
        external = None
        if nic:
            external = next((a.nat_i_p for a in nic.access_configs if a.nat_i_p), None)
        accelerators = ", ".join(
            f"{a.accelerator_count} x {_last(a.accelerator_type)}" for a in inst.guest_accelerators
        )
        scheduling = inst.scheduling
        account = inst.service_accounts[0] if inst.service_accounts else None
        return Node(
            name=inst.name,
            state=_STATES.get(inst.status, NodeState.PENDING),
            status=inst.status,
            internal_ip=internal,
            external_ip=external,
            ssh_host=external,
            ssh_port=self.config.ssh.port,
            zone=_last(inst.zone),
            machine_type=_last(inst.machine_type),
            accelerators=accelerators or None,
            preemptible=bool(scheduling.preemptible) or scheduling.provisioning_model == "SPOT",
            labels=dict(inst.labels),
            service_account=account.email if account else None,
            scopes=tuple(account.scopes) if account else (),
        )

    def _labels(self, name: str) -> dict[str, str]:
        roles = self.config.roles_of(name)
        return {
            **self.gce.labels,
            CLUSTER_LABEL: self.config.name,
            ID_LABEL: self.state.cluster_id(),
            ROLE_LABEL: "-".join(roles) if roles else "none",
        }

    def _metadata_items(self, public_key: str) -> dict[str, str]:
        extra = dict(self.gce.metadata)
        image = checks.parse_image(self.gce.image)
        if checks.gpus(self.gce) is not None and image.project == checks.DLVM_PROJECT:
            # A Deep Learning VM image installs the NVIDIA driver on first
            # boot only when asked; GPUs without it are billed and unused.
            extra.setdefault(checks.DRIVER_KEY, "True")
        return {
            **extra,
            "ssh-keys": f"{self.config.ssh.user}:{public_key}",
            # OS Login would ignore metadata keys; this cluster logs in with its own.
            "enable-oslogin": "FALSE",
            # The guest agent then publishes the VM's SSH host keys where the
            # Compute API reads them (``host_keys``): no trust on first use.
            "enable-guest-attributes": "TRUE",
        }

    def _sync_nodes(
        self, instances: Mapping[str, list[compute_v1.Instance]], public_key: str
    ) -> None:
        """Set our labels and metadata keys on the declared nodes that differ."""
        targets = [
            inst for name, found in instances.items() if name in self.config.nodes for inst in found
        ]
        wanted_items = self._metadata_items(public_key)

        def sync(key: tuple[str, str]) -> None:
            zone, name = key
            for _ in range(3):  # a concurrent change moves the fingerprint: read again
                inst = self._get_instance(zone, name)
                if inst is None:
                    return
                try:
                    self._sync_one(zone, inst, wanted_items)
                    return
                except api_exceptions.PreconditionFailed:
                    continue
            raise ProviderError(f"{name}: its labels or metadata keep changing; try again")

        if unlabelled := sorted({i.name for i in targets if ID_LABEL not in i.labels}):
            log.warning(
                "%s had no %s label (made by an older tfcluster): labelled as this cluster's",
                ", ".join(unlabelled),
                ID_LABEL,
            )
        keys = [(_last(i.zone), i.name) for i in targets if self._out_of_sync(i, wanted_items)]
        _, errors = self._parallel(sync, keys)
        self._raise_errors(errors, "updating node labels and SSH key")

    def _out_of_sync(self, inst: compute_v1.Instance, items: Mapping[str, str]) -> bool:
        labels = dict(inst.labels)
        current = {i.key: i.value for i in inst.metadata.items}
        return any(labels.get(k) != v for k, v in self._labels(inst.name).items()) or any(
            current.get(k) != v for k, v in items.items()
        )

    def _sync_one(self, zone: str, inst: compute_v1.Instance, items: Mapping[str, str]) -> None:
        want_labels = self._labels(inst.name)
        labels = dict(inst.labels)
        if any(labels.get(k) != v for k, v in want_labels.items()):
            # Other labels (added by hand) stay.
            op = self._set_labels(
                zone, inst.name, {**labels, **want_labels}, inst.label_fingerprint
            )
            self._wait_operation(op, zone=zone, what=f"set the labels of {inst.name}")
        current = {i.key: i.value for i in inst.metadata.items}
        if any(current.get(k) != v for k, v in items.items()):
            merged = {**current, **items}
            metadata = compute_v1.Metadata(
                fingerprint=inst.metadata.fingerprint,
                items=[compute_v1.Items(key=k, value=v) for k, v in merged.items()],
            )
            log.info("installing the cluster's SSH key on %s", inst.name)
            op = self._set_metadata(zone, inst.name, metadata)
            self._wait_operation(op, zone=zone, what=f"set the metadata of {inst.name}")

    def host_keys(self, node: Node) -> HostKeys | None:
        """The host keys the guest agent published in the instance's guest
        attributes (``hostkeys/<type>`` = base64, as gcloud reads them),
        pinned under ``compute.<instance id>``: a new VM of the same name is
        a new id; the same VM keeps its pin across stop, start and new IPs."""
        zone = node.zone or ""
        with self._api_errors(f"reading the SSH host keys of {node.name}"):
            inst = self._get_instance(zone, node.name)
            if inst is None or not inst.id:
                raise StateError(f"{node.name} no longer exists; run `deploy.py up`")
            entries = self._guest_attributes(zone, node.name, "hostkeys/")
        keys = []
        for entry in entries:
            # Text from the guest: only well-formed "<type> <base64>" is kept.
            if (
                entry.namespace == "hostkeys"
                and _KEY_TYPE.match(entry.key)
                and _BASE64.match(entry.value)
            ):
                keys.append(f"{entry.key} {entry.value}")
        return HostKeys(alias=f"compute.{inst.id}", keys=tuple(keys))
