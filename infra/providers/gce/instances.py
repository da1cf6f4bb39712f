"""Creating, starting, stopping and deleting instances, and waiting for them.

Creation places a batch of new nodes in one zone (TensorFlow's gRPC
traffic between zones is slower and billed): first the zone the cluster's
existing nodes are in, then ``gce.zones`` in order. When a zone is out of
capacity or quota, what the batch created there is deleted and the whole
batch moves to the next zone; when none can take it, ``CapacityError``
lists every zone's reason.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import cast

from infra.config.loader import in_file
from infra.errors import CapacityError, ConfigError, ProviderError, StateError
from infra.providers.base import NodeState, login_key
from infra.providers.gce import body, checks, identity
from infra.providers.gce._google import api_exceptions, compute_v1
from infra.providers.gce.api import _CALL_TIMEOUT_S, _last, _retried
from infra.providers.gce.errors import (
    _api_message,
    _is_quota,
    _OperationFailed,
    _ZoneUnusable,
    is_stockout,
    not_in_zone,
    unknown_zone,
)
from infra.providers.gce.nodes import (
    _STATES,
    _STOPPING_STATUSES,
    CLUSTER_LABEL,
    ID_LABEL,
    UNMARKED,
    GceNodes,
)
from infra.providers.gce.parallel import _pause

log = logging.getLogger("tfcluster")


class GceInstances(GceNodes):
    """Changes the cluster's instances, several at once."""

    @_retried("create instance {name} in {zone}", mutates=True)
    def _insert_instance(
        self, zone: str, name: str, body: compute_v1.Instance
    ) -> compute_v1.Operation:
        return self.api.instances.insert_unary(
            project=self.api.project,
            zone=zone,
            instance_resource=body,
            retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("{action} instance {name} in {zone}", mutates=True)
    def _instance_action(self, action: str, zone: str, name: str) -> compute_v1.Operation | None:
        """start, resume or delete; None when the instance is gone (404)."""
        method = getattr(self.api.instances, f"{action}_unary")
        try:
            return cast(
                "compute_v1.Operation",
                method(
                    project=self.api.project,
                    zone=zone,
                    instance=name,
                    retry=None,
                    timeout=_CALL_TIMEOUT_S,
                ),
            )
        except api_exceptions.NotFound:
            return None

    @_retried("stop instance {name} in {zone}", mutates=True)
    def _stop_instance(
        self, zone: str, name: str, discard_local_ssd: bool | None
    ) -> compute_v1.Operation | None:
        """None when the instance is gone (404). ``discard_local_ssd``: sent
        only for a node with Local SSD, which GCE refuses to stop without
        it (400 "VM has a Local SSD attached but an undefined value for
        `discard-local-ssd`", skypilot-org/skypilot#2586)."""
        request = compute_v1.StopInstanceRequest(project=self.api.project, zone=zone, instance=name)
        if discard_local_ssd is not None:
            request.discard_local_ssd = discard_local_ssd
        try:
            return self.api.instances.stop_unary(
                request=request, retry=None, timeout=_CALL_TIMEOUT_S
            )
        except api_exceptions.NotFound:
            return None

    def _instance_body(self, zone: str, name: str, public_key: str) -> compute_v1.Instance:
        gce = self.gce
        labels = self._labels(name)
        return compute_v1.Instance(
            name=name,
            description=f"tfcluster {self.config.name} node {name}",
            machine_type=f"zones/{zone}/machineTypes/{gce.machine_type}",
            labels=labels,
            tags=compute_v1.Tags(items=[self.network_tag]),
            metadata=compute_v1.Metadata(
                items=[
                    compute_v1.Items(key=k, value=v)
                    for k, v in self._metadata_items(public_key).items()
                ]
            ),
            disks=[body.boot_disk(gce, zone, labels, self._image_gb)],
            network_interfaces=[body.network_interface(gce, self._network(), zone)],
            scheduling=body.scheduling(gce),
            guest_accelerators=body.accelerators(gce, self.api.project, zone),
            # The node's identity: its metadata server's tokens (for gs://).
            service_accounts=[
                compute_v1.ServiceAccount(
                    email=gce.service_account, scopes=identity.scope_urls(gce.scopes)
                )
            ],
        )

    def _zone_order(self, existing: Mapping[str, list[compute_v1.Instance]]) -> list[str]:
        """gce.zones, those with most of the cluster's nodes first."""
        counts = Counter(_last(i.zone) for found in existing.values() for i in found)
        zones = list(self.gce.zones)
        return sorted(zones, key=lambda z: (-counts.get(z, 0), zones.index(z)))

    def create_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        if not names:
            return
        _, public_key = login_key(self.config, self.state)
        with self._api_errors(f"creating {', '.join(names)}"):
            existing = self._instances_as_listed()  # `up`'s, when it just listed
            present = [n for n in names if n in existing]
            if present:
                # Created meanwhile (another run, or an interrupted one): start, not re-create.
                self._start_existing(present, existing)
            missing = [n for n in names if n not in existing]
            if missing:
                self._create_in_one_zone(missing, public_key, existing)
            self._wait_for(names, NodeState.RUNNING, "start")

    def _create_in_one_zone(
        self,
        names: list[str],
        public_key: str,
        existing: Mapping[str, list[compute_v1.Instance]],
    ) -> str:
        zones = self._zone_order(existing)
        reasons: dict[str, str] = {}
        for index, zone in enumerate(zones):
            log.info("creating %s in %s", ", ".join(names), zone)
            _, errors = self._parallel(
                functools.partial(self._create_one, zone, public_key=public_key), names
            )
            unusable = {n: e for n, e in errors.items() if isinstance(e, _ZoneUnusable)}
            others = {n: e for n, e in errors.items() if n not in unusable}
            wrong = [e for e in others.values() if isinstance(e, ConfigError)]
            if wrong:
                with in_file(self.config):
                    raise wrong[0]  # the same line for every node: once
            if others:
                self._raise_errors(others, f"creating nodes in {zone}")
            if not unusable:
                return zone
            reasons[zone] = "; ".join(dict.fromkeys(str(e) for e in unusable.values()))
            # The batch stays together: what this zone did create goes too.
            self._delete_in_zone(zone, names)
            if index + 1 < len(zones):
                log.warning("zone %s: %s; trying zone %s", zone, reasons[zone], zones[index + 1])
            else:
                # The CapacityError below repeats every zone's reason.
                log.info("zone %s: %s; no zone left to try", zone, reasons[zone])
        raise CapacityError(
            f"no zone could create {', '.join(names)}: "
            + "; ".join(f"{zone}: {reason}" for zone, reason in reasons.items()),
            hint="add zones (another region too) to gce.zones, choose another "
            "gce.machine_type, or ask for more quota; nothing of this attempt was left running",
        )

    def _create_one(self, zone: str, name: str, *, public_key: str) -> None:
        body = self._instance_body(zone, name, public_key)
        try:
            op = self._insert_instance(zone, name, body)
        except api_exceptions.Conflict:
            self._adopt(zone, name)
            return
        except api_exceptions.Forbidden as exc:
            if _is_quota(exc):
                raise _ZoneUnusable(f"QUOTA_EXCEEDED: {_api_message(exc)}") from exc
            raise
        except (api_exceptions.NotFound, api_exceptions.BadRequest) as exc:
            message = _api_message(exc)
            # The machine, disk or GPU type is not offered in this zone (G2
            # is not in every zone, nor is every GPU): the next zone may.
            if not_in_zone(message, zone):
                raise _ZoneUnusable(f"not available: {message}") from exc
            if unknown_zone(message):
                raise ConfigError(
                    f"gce.zones: {zone} is a zone the Compute API does not know (\"Unknown "
                    "zone\"); `gcloud compute zones list` shows the zones"
                ) from None
            raise
        except api_exceptions.GoogleAPICallError as exc:
            # A stockout answered at once (HTTP 503) rather than in the
            # operation; it is not retried (other 5xx are, then a ProviderError).
            if is_stockout(_api_message(exc)):
                raise _ZoneUnusable(f"HTTP {exc.code}: {_api_message(exc)}") from exc
            raise
        try:
            self._wait_operation(op, zone=zone, what=f"create {name} in {zone}")
        except _OperationFailed as failed:
            if failed.capacity:
                raise _ZoneUnusable(failed.reason) from failed
            raise

    def _adopt(self, zone: str, name: str) -> None:
        """An instance of this name exists in ``zone`` (409): ours if it has our
        label (a retried insert that had gone through), else refuse."""
        inst = self._get_instance(zone, name)
        if inst is None:
            raise ProviderError(f"{name} in {zone} was reported as existing, then vanished")
        owner = inst.labels.get(CLUSTER_LABEL)
        if owner != self.config.name:
            raise ProviderError(
                f"an instance named {name} already exists in {zone} and is not part of "
                f"cluster {self.config.name} ({CLUSTER_LABEL}={owner or 'unset'})",
                hint="rename the node in cluster.yaml, or delete that instance yourself",
            )
        if not self._ours(inst):
            raise self.not_ours({name: inst.labels.get(ID_LABEL, UNMARKED)})
        if _STATES.get(inst.status) in (NodeState.STOPPED, NodeState.STOPPING):
            self._start_one(zone, name)

    def _delete_in_zone(self, zone: str, names: Sequence[str]) -> None:
        """Delete the cluster's instances of ``names`` in ``zone`` (a failed
        batch's successes and half-created leftovers)."""
        leftovers = [i.name for i in self._list_zone(zone) if i.name in names and self._ours(i)]
        if not leftovers:
            return
        log.info("deleting %s in %s", ", ".join(leftovers), zone)
        _, errors = self._parallel(lambda n: self._delete_one(zone, n), leftovers)
        self._raise_errors(
            errors, f"deleting the half-created nodes in {zone} (run `deploy.py down`)"
        )

    def _start_existing(
        self, names: Sequence[str], existing: Mapping[str, list[compute_v1.Instance]]
    ) -> None:
        def start(name: str) -> None:
            inst = existing[name][0]
            if _STATES.get(inst.status) in (NodeState.STOPPED, NodeState.STOPPING):
                self._start_one(_last(inst.zone), name)

        _, errors = self._parallel(start, list(names))
        self._raise_errors(errors, "starting")

    def _start_one(self, zone: str, name: str) -> None:
        inst = self._get_instance(zone, name)
        if inst is None:
            raise ProviderError(f"{name} disappeared before it could be started")
        if inst.status in _STOPPING_STATUSES:
            # GCE refuses to start an instance that is still stopping.
            inst = self._wait_instance(zone, name, {"TERMINATED", "STOPPED", "SUSPENDED"})
        if _STATES.get(inst.status) is not NodeState.STOPPED:
            return  # running or on its way
        action = "resume" if inst.status == "SUSPENDED" else "start"
        op = self._instance_action(action, zone, name)
        if op is None:
            raise ProviderError(f"{name} disappeared before it could be started")
        try:
            self._wait_operation(op, zone=zone, what=f"{action} {name} in {zone}")
        except _OperationFailed as failed:
            if failed.capacity:
                # A stopped node's disk lives in its zone: no failover for a start.
                raise CapacityError(
                    f"zone {zone} cannot start {name} now ({failed.reason})",
                    hint="try again later, or `deploy.py down` and `up` to create the "
                    "cluster in another zone",
                ) from failed
            raise

    def _wait_instance(self, zone: str, name: str, statuses: set[str]) -> compute_v1.Instance:
        deadline = time.monotonic() + self.gce.operation_timeout
        delays = self._poll_delays()
        while True:
            inst = self._get_instance(zone, name)
            if inst is None:
                raise ProviderError(f"{name} disappeared while waiting for it")
            if inst.status in statuses:
                return inst
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"{name} still {inst.status} after {self.gce.operation_timeout:g} s"
                )
            _pause(next(delays))

    def start_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        if not names:
            return
        _, public_key = login_key(self.config, self.state)
        with self._api_errors(f"starting {', '.join(names)}"):
            existing = self._instances()
            missing = [n for n in names if n not in existing]
            if missing:
                raise StateError(f"{', '.join(missing)} does not exist; `deploy.py up` creates it")
            # A node stopped since the key changed would refuse our login.
            self._sync_nodes({n: existing[n] for n in names}, public_key)
            self._start_existing(names, existing)
            self._wait_for(names, NodeState.RUNNING, "start")

    def stop_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        with self._api_errors(f"stopping {', '.join(names)}"):
            existing = self._instances()
            found = [
                inst
                for name in names
                for inst in existing.get(name, [])
                if _STATES.get(inst.status) is not NodeState.STOPPED
            ]
            local_ssd = {(_last(i.zone), i.name): _has_local_ssd(i) for i in found}
            _, errors = self._parallel(lambda t: self._stop_one(*t, local_ssd[t]), list(local_ssd))
            self._raise_errors(errors, "stopping")

    def _stop_one(self, zone: str, name: str, local_ssd: bool) -> None:
        keep = self.gce.local_ssd_on_stop == "keep"
        if local_ssd and keep:
            log.info("%s: keeping its Local SSD data (gce.local_ssd_on_stop: keep)", name)
        try:
            op = self._stop_instance(zone, name, (not keep) if local_ssd else None)
        except api_exceptions.BadRequest as exc:
            if not (local_ssd and keep):
                raise
            raise ProviderError(
                f"GCE refused to stop {name} keeping its Local SSD data: {_api_message(exc)}",
                hint="set gce.local_ssd_on_stop: discard in cluster.yaml to stop it without "
                "that data (it is lost), or `deploy.py down`",
            ) from exc
        if op is not None:  # None: deleted meanwhile, which is stopped enough
            self._wait_operation(op, zone=zone, what=f"stop {name} in {zone}")

    def terminate_nodes(self, names: Sequence[str]) -> None:
        names = list(dict.fromkeys(names))
        with self._api_errors(f"deleting {', '.join(names)}"):
            existing = self._instances()
            targets = [
                (_last(inst.zone), inst.name) for name in names for inst in existing.get(name, [])
            ]
            _, errors = self._parallel(lambda t: self._delete_one(*t), targets)
            self._raise_errors(errors, "deleting")

    def _delete_one(self, zone: str, name: str) -> None:
        op = self._instance_action("delete", zone, name)
        if op is None:
            return  # already gone
        try:
            self._wait_operation(op, zone=zone, what=f"delete {name} in {zone}")
        except _OperationFailed as failed:
            if "RESOURCE_NOT_FOUND" not in failed.codes:
                raise

    def _wait_for(self, names: Sequence[str], target: NodeState, what: str) -> None:
        """Poll the listing until every named node is in ``target``."""
        timeout = self.gce.operation_timeout
        deadline = time.monotonic() + timeout
        delays = self._poll_delays()
        while True:
            existing = self._instances()
            missing = [n for n in names if n not in existing]
            if missing:
                raise ProviderError(
                    f"{', '.join(missing)} disappeared while waiting for it to {what} "
                    "(deleted by someone, or a failed create)",
                    hint="run `deploy.py up` again",
                )
            status = {n: existing[n][0].status for n in names}
            if target is NodeState.RUNNING:
                stopped = [n for n in names if _STATES.get(status[n]) is NodeState.STOPPED]
                if stopped:
                    raise ProviderError(
                        f"{', '.join(stopped)} stopped while starting (a Spot VM may have "
                        "been preempted)",
                        hint="run `deploy.py up` again",
                    )
            waiting = [n for n in names if _STATES.get(status[n]) is not target]
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise ProviderError(
                    f"not {target.value} after {timeout:g} s: "
                    + ", ".join(f"{n} {status[n]}" for n in waiting),
                    hint="`deploy.py status` shows them; run the command again",
                )
            _pause(next(delays))


def _has_local_ssd(inst: compute_v1.Instance) -> bool:
    """Local SSD attached (listed as SCRATCH disks), or bundled with the
    machine type (A2 Ultra, A3: checks.bundles_local_ssd)."""
    return any(d.type_ == "SCRATCH" for d in inst.disks) or checks.bundles_local_ssd(
        _last(inst.machine_type)
    )
