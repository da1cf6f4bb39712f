"""What ``status`` shows of a cluster, as data: a row per node
(``NodeView``) and the whole (``ClusterOverview``: the rows, the estimated
cost now and where it comes from, autostop, the last job). ``Cluster.status``
and ``Cluster.overview`` (infra/cluster/api.py) gather them; the CLI prints
them as they are (tfcluster_cli/render.py), and ``status --json`` dumps the
rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from infra.cluster import autostop
from infra.node import facts
from infra.spec.job import JobRecord


@dataclass(frozen=True)
class NodeView:
    """One row of ``status``: a node as the provider sees it, with its roles."""

    name: str
    status: str  # the provider's word (RUNNING, TERMINATED, ...) or ABSENT
    state: str  # pending | running | stopping | stopped | absent
    roles: list[str]
    zone: str | None
    internal_ip: str | None
    external_ip: str | None
    machine_type: str | None
    accelerators: str | None
    preemptible: bool
    declared: bool  # in cluster.yaml (an undeclared one still carries our label)
    hourly_usd: float | None  # this node as it is now (a stopped one pays its disk)
    gpus: facts.GpuReport | None = None  # None: not asked (see Cluster.status)
    # The cloud identity of its programs (GCE: the service account and its scopes).
    service_account: str | None = None
    scopes: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["gpus"] = self.gpus.as_dict() if self.gpus is not None else None
        return out


@dataclass(frozen=True)
class ClusterOverview:
    """What `status` shows of a cluster, gathered at once (``Cluster.overview``):
    its nodes, the estimated USD/hour now and where that comes from, its
    autostop and its last job."""

    name: str
    provider: str
    views: list[NodeView]
    hourly_usd: float | None
    price_source: str | None
    idle: autostop.ClusterIdle | None
    last_job: JobRecord | None
