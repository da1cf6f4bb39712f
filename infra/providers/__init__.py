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
from collections.abc import Callable, Iterable

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


def provider_sections(names: Iterable[str]) -> dict[str, type[BaseModel]]:
    """cluster.yaml's sections (``config_section``) of the providers
    ``names``, by provider name. Only these are imported: config.py asks for
    those a file uses, so validating a local cluster loads no cloud's code."""
    sections = {}
    for name in names:
        section = provider_class(name).config_section
        if section is not None:
            sections[name] = section
    return sections


def used_providers(config: ClusterConfig) -> list[type[NodeProvider]]:
    """The classes of the providers a validated config uses: the one it
    names, then any other whose section it has (config.py added those)."""
    sections = [n for n in type(config).model_fields if n not in ClusterConfig.model_fields]
    others = [n for n in sections if n in PROVIDERS and n != config.provider]
    return [provider_class(n) for n in [config.provider, *others]]


def get_provider(config: ClusterConfig, state: ClusterState | None = None) -> NodeProvider:
    """The provider cluster.yaml names."""
    return provider_factory(config.provider)(config, state or ClusterState(config.name))
