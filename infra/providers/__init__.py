"""Providers: where the nodes of a cluster come from (gce, ssh, local).

A provider is a plug-in: its own module (a ``NodeProvider`` subclass, with
its cluster.yaml section as ``config_section``) plus one line in
``PROVIDERS`` below, or a ``register_provider`` call. The registry holds "module:Class" text and
imports a provider only when a cluster names it, so the local cluster never
pays for loading the Compute client. What differs between providers is asked
of the provider (``NodeProvider``'s attributes and hooks), never of its name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from pydantic import BaseModel

from infra.config import ClusterConfig
from infra.providers.base import NodeProvider
from infra.state import ClusterState

#: What builds a provider: a ``NodeProvider`` subclass, or any callable
#: with its constructor's signature.
ProviderFactory = Callable[[ClusterConfig, ClusterState], NodeProvider]

#: cluster.yaml's ``provider`` -> where its class lives (loaded lazily).
PROVIDERS: dict[str, str | ProviderFactory] = {
    "gce": "infra.providers.gce:GceProvider",
    "ssh": "infra.providers.ssh:SshProvider",
    "local": "infra.providers.local:LocalProvider",
}


def register_provider(name: str, factory: str | ProviderFactory) -> None:
    """Add (or replace) a provider: ``factory`` is a class, a callable, or
    "module:Class" text imported when first used. cluster.yaml accepts
    ``provider: <name>`` from then on."""
    PROVIDERS[name] = factory


def provider_names() -> tuple[str, ...]:
    """The names cluster.yaml's ``provider`` may take, in registry order."""
    return tuple(PROVIDERS)


def provider_factory(name: str) -> ProviderFactory:
    """What builds provider ``name``, imported now if it is still text."""
    entry = PROVIDERS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        assert callable(entry)
        PROVIDERS[name] = entry
    return entry


def provider_class(name: str) -> type[NodeProvider]:
    """The class of provider ``name``, for what it says before any node
    exists (GPUs per node); a plain factory is asked for nothing."""
    factory = provider_factory(name)
    if isinstance(factory, type) and issubclass(factory, NodeProvider):
        return factory
    return NodeProvider


def provider_sections(skip: tuple[str, ...] = ()) -> dict[str, type[BaseModel]]:
    """cluster.yaml's sections the providers bring (``config_section``), by
    provider name; the names in ``skip`` (ClusterConfig's own fields, such
    as gce) are not asked, so validating a file imports no built-in cloud."""
    sections = {}
    for name in PROVIDERS:
        if name not in skip:
            section = provider_class(name).config_section
            if section is not None:
                sections[name] = section
    return sections


def get_provider(config: ClusterConfig, state: ClusterState | None = None) -> NodeProvider:
    """The provider cluster.yaml names."""
    return provider_factory(config.provider)(config, state or ClusterState(config.name))
