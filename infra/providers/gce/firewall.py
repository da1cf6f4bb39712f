"""The cluster's firewall rules: TensorFlow's gRPC open between its own
nodes only, SSH from ``gce.ssh_source_ranges`` only, each with a deny rule
beneath it so that a broad allow at the bottom of the network (the
``default`` network's) cannot open them; drift repaired on every ``up``."""

from __future__ import annotations

import logging
import re
from typing import Any

from infra.providers.gce._google import api_exceptions, compute_v1
from infra.providers.gce.api import _CALL_TIMEOUT_S, GceApi, _last, _retried
from infra.providers.gce.nodes import UNMARKED

log = logging.getLogger("tfcluster")

# The TensorFlow deny rule's priority: below (weaker than) the allow rules
# at 1000, above (stronger than) GCE's default-allow-internal at 65534.
DENY_PRIORITY = 65000
# A firewall rule has no labels: the cluster's id is in its description.
_OWNER = re.compile(r"\[tfcluster-id=([0-9a-f]{12})\]\Z")


def rule_owner(rule: compute_v1.Firewall) -> str | None:
    """The id of the cluster that made the rule; None: an older tfcluster."""
    found = _OWNER.search(rule.description or "")
    return found[1] if found else None


class GceFirewall(GceApi):
    """Creates, repairs and deletes the cluster's firewall rules."""

    @_retried("get firewall rule {name}", mutates=False)
    def _get_firewall(self, name: str) -> compute_v1.Firewall | None:
        try:
            return self.api.firewalls.get(
                project=self._firewall_project(),
                firewall=name,
                retry=None,
                timeout=_CALL_TIMEOUT_S,
            )
        except api_exceptions.NotFound:
            return None

    @_retried("create firewall rule {body.name}", mutates=True, changes_instances=False)
    def _insert_firewall(self, body: compute_v1.Firewall) -> compute_v1.Operation:
        return self.api.firewalls.insert_unary(
            project=self._firewall_project(),
            firewall_resource=body,
            retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("update firewall rule {body.name}", mutates=True, changes_instances=False)
    def _update_firewall(self, body: compute_v1.Firewall) -> compute_v1.Operation:
        # update (PUT) replaces the rule: a field the rule should not have
        # (a stray sourceRanges) is cleared, which PATCH would keep.
        return self.api.firewalls.update_unary(
            project=self._firewall_project(),
            firewall=body.name,
            firewall_resource=body,
            retry=None,
            timeout=_CALL_TIMEOUT_S,
        )

    @_retried("delete firewall rule {name}", mutates=True, changes_instances=False)
    def _delete_firewall(self, name: str) -> compute_v1.Operation | None:
        try:
            return self.api.firewalls.delete_unary(
                project=self._firewall_project(),
                firewall=name,
                retry=None,
                timeout=_CALL_TIMEOUT_S,
            )
        except api_exceptions.NotFound:
            return None

    def shared_resources(self) -> list[str]:
        ranges = ", ".join(self.gce.ssh_source_ranges)
        ssh = f"firewall rule {self.ssh_rule} (SSH from {ranges})"
        if self._ssh_open_to_all():
            return [
                f"firewall rule {self.grpc_rule}",
                f"firewall rule {self.deny_rule} (TensorFlow ports closed to all other sources)",
                ssh + ": open to the whole internet",
            ]
        return [
            f"firewall rule {self.grpc_rule}",
            f"firewall rule {self.deny_rule} (TensorFlow ports closed to all other sources)",
            ssh,
            f"firewall rule {self.ssh_deny_rule} (SSH closed to all other sources)",
        ]

    def _rule_names(self) -> list[str]:
        return [self.grpc_rule, self.deny_rule, self.ssh_rule, self.ssh_deny_rule]

    def _described(self, what: str) -> str:
        return f"tfcluster {self.config.name}: {what} [tfcluster-id={self.state.cluster_id()}]"

    def _foreign_owner(self, rule: compute_v1.Firewall | None) -> str | None:
        """Whose the rule is when not this state's: its id, or ``none`` (an
        older tfcluster's, not taken by a state younger than its id)."""
        if rule is None:
            return None
        owner = rule_owner(rule)
        if owner is None:
            return None if self.state.adopts_unmarked() else UNMARKED
        return None if owner == self.state.cluster_id() else owner

    def foreign_rules(self) -> dict[str, str]:
        """The cluster's rule names that another state's rules hold: name -> its id."""
        found: dict[str, str] = {}
        for name in self._rule_names():
            if (owner := self._foreign_owner(self._get_firewall(name))) is not None:
                found[name] = owner
        return found

    def _ssh_open_to_all(self) -> bool:
        return any(r in ("0.0.0.0/0", "::/0") for r in self.gce.ssh_source_ranges)

    def _firewall_project(self) -> str:
        """Where the firewall rules live: the network's project (the host
        project of a Shared VPC, given as projects/HOST/global/networks/NAME;
        GCE refuses a rule for another project's network)."""
        match = re.match(r"^projects/([^/]+)/", self._network())
        return match[1] if match else self.api.project

    def _firewall_rules(self) -> dict[str, compute_v1.Firewall]:
        ports = self.config.ports
        grpc_ports = sorted({ports.ps, ports.worker, ports.chief})
        return {
            # TensorFlow's gRPC has no authentication: only the cluster's own
            # instances (by network tag) may reach it, never an address range.
            self.grpc_rule: compute_v1.Firewall(
                name=self.grpc_rule,
                description=self._described("TensorFlow gRPC between its nodes"),
                network=self._network(),
                direction="INGRESS",
                priority=1000,
                allowed=[
                    compute_v1.Allowed(I_p_protocol="tcp", ports=[str(p) for p in grpc_ports])
                ],
                source_tags=[self.network_tag],
                target_tags=[self.network_tag],
            ),
            # The allow rule above is tag-to-tag, but the `default` network's
            # own default-allow-internal (10.128.0.0/9, every port, priority
            # 65534) reaches the TensorFlow ports of every VM, and a TF
            # server runs whatever code reaches it. This deny rule sits
            # between the two: weaker than our allow (so the cluster's own
            # instances still reach each other), stronger than any
            # broad allow at the bottom, whatever network it is.
            self.deny_rule: compute_v1.Firewall(
                name=self.deny_rule,
                description=self._described("TensorFlow gRPC closed to all but its nodes"),
                network=self._network(),
                direction="INGRESS",
                priority=DENY_PRIORITY,
                denied=[compute_v1.Denied(I_p_protocol="tcp", ports=[str(p) for p in grpc_ports])],
                source_ranges=["0.0.0.0/0"],
                target_tags=[self.network_tag],
            ),
            self.ssh_rule: compute_v1.Firewall(
                name=self.ssh_rule,
                description=self._described("SSH from gce.ssh_source_ranges"),
                network=self._network(),
                direction="INGRESS",
                priority=1000,
                allowed=[compute_v1.Allowed(I_p_protocol="tcp", ports=[str(self.config.ssh.port)])],
                source_ranges=list(self.gce.ssh_source_ranges),
                target_tags=[self.network_tag],
            ),
            # The `default` network's default-allow-ssh (0.0.0.0/0, 65534)
            # would let everyone else in too: deny them between the two.
            # None when SSH is open to all anyway (the rule is then deleted).
            **({} if self._ssh_open_to_all() else {self.ssh_deny_rule: self._ssh_deny()}),
        }

    def _ssh_deny(self) -> compute_v1.Firewall:
        return compute_v1.Firewall(
            name=self.ssh_deny_rule,
            description=self._described("SSH closed to all but ssh_source_ranges"),
            network=self._network(),
            direction="INGRESS",
            priority=DENY_PRIORITY,
            denied=[compute_v1.Denied(I_p_protocol="tcp", ports=[str(self.config.ssh.port)])],
            source_ranges=["0.0.0.0/0"],
            target_tags=[self.network_tag],
        )

    @staticmethod
    def _firewall_shape(rule: compute_v1.Firewall) -> tuple[Any, ...]:
        """What matters of a rule, comparable between ours and the API's
        (its owner too: an older tfcluster's rule gets the cluster's id)."""
        return (
            rule_owner(rule),
            _last(rule.network),
            rule.direction,
            rule.priority,
            sorted((a.I_p_protocol, tuple(sorted(a.ports))) for a in rule.allowed),
            sorted((d.I_p_protocol, tuple(sorted(d.ports))) for d in rule.denied),
            sorted(rule.source_ranges),
            sorted(rule.source_tags),
            sorted(rule.target_tags),
        )

    def _ensure_firewall(self, want: compute_v1.Firewall) -> None:
        current = self._get_firewall(want.name)
        if current is None:
            try:
                op = self._insert_firewall(want)
            except api_exceptions.Conflict:
                current = self._get_firewall(want.name)  # created meanwhile by another run
            else:
                self._wait_operation(op, zone=None, what=f"create firewall rule {want.name}")
                return
        if current is not None and self._firewall_shape(current) != self._firewall_shape(want):
            log.info("updating firewall rule %s to match cluster.yaml", want.name)
            op = self._update_firewall(want)
            self._wait_operation(op, zone=None, what=f"update firewall rule {want.name}")

    def release(self) -> None:
        def delete(name: str) -> None:
            if (owner := self._foreign_owner(self._get_firewall(name))) is not None:
                log.warning("not deleting firewall rule %s: another cluster's (%s)", name, owner)
                return
            op = self._delete_firewall(name)
            if op is not None:
                self._wait_operation(op, zone=None, what=f"delete firewall rule {name}")

        with self._api_errors("deleting the firewall rules"):
            _, errors = self._parallel(delete, self._rule_names())
            self._raise_errors(errors, "deleting firewall rules")
