"""Providers: where the nodes of a cluster come from (gce, ssh, local)."""

from __future__ import annotations

from infra.config import ClusterConfig
from infra.providers.base import NodeProvider
from infra.state import ClusterState


def get_provider(config: ClusterConfig, state: ClusterState | None = None) -> NodeProvider:
    """The provider cluster.yaml names. Imported lazily: the local cluster
    must not pay for loading the Compute client."""
    state = state or ClusterState(config.name)
    if config.provider == "gce":
        from infra.providers.gce import GceProvider

        return GceProvider(config, state)
    if config.provider == "ssh":
        from infra.providers.ssh import SshProvider

        return SshProvider(config, state)
    from infra.providers.local import LocalProvider

    return LocalProvider(config, state)
