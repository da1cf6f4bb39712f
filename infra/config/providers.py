"""The provider registry: the names cluster.yaml's ``provider`` may take,
where each provider's class lives, and what the config asks a provider
before any node exists (``ConfigHooks``).

A provider is a plug-in: its own module (a ``NodeProvider`` subclass, with
its cluster.yaml section as ``config_section``) plus one line in
``PROVIDERS`` below, or a ``register_provider`` call. The registry holds
"module:Class" text and imports a provider only when a cluster names it, so
the local cluster never pays for loading the Compute client.

It sits with the config, below the providers: the config reads it while
validating a file, and ``NodeProvider`` (infra/providers/base.py) is a
``ConfigHooks``. It imports nothing of infra.
"""


from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from pydantic import BaseModel

#: cluster.yaml's ``provider`` -> where its class lives (loaded lazily), or
#: what builds it: a ``NodeProvider`` subclass, or any callable with its
#: constructor's signature (``infra.providers.base.ProviderFactory``).
PROVIDERS: dict[str, str | Callable[..., Any]] = {
    "gce": "infra.providers.gce:GceProvider",
    "ssh": "infra.providers.ssh:SshProvider",
    "local": "infra.providers.local:LocalProvider",
}


class ConfigHooks:
    """What cluster.yaml asks a provider's class before any node exists;
    ``NodeProvider`` inherits these defaults. ``config`` is the validated
    ``ClusterConfig`` (not imported here: the config imports this)."""

    #: The provider's own section of cluster.yaml, under its name (a strict
    #: pydantic model; every field with a default): config.py adds it to the
    #: file's keys when the file names this provider or has the key. None: no
    #: section (ssh and hosts, which SSH transports and the config's checks
    #: read too, are ClusterConfig's own fields).
    config_section: ClassVar[type[BaseModel] | None] = None

    @classmethod
    def config_problem(cls, config: Any) -> tuple[tuple[str, ...], str] | None:
        """What this provider refuses in an otherwise valid cluster.yaml, as
        (the key it is about, one line); None when it has what it needs.
        config.py asks it while validating the file."""
        return None

    @classmethod
    def secret_files(cls, config: Any) -> list[str]:
        """Files this provider's section names that must never leave this
        machine (a service-account key), as cluster.yaml writes them: a
        job's working folder is synced without them."""
        return []

    @classmethod
    def gpus_per_node(cls, config: Any) -> int:
        """GPUs each node has, from the config alone (setup installs the
        GPU build of TensorFlow and checks the driver when > 0)."""
        return 0


def register_provider(name: str, factory: str | Callable[..., Any]) -> None:
    """Add (or replace) a provider: ``factory`` is a class, a callable, or
    "module:Class" text imported when first used. cluster.yaml accepts
    ``provider: <name>`` from then on."""
    PROVIDERS[name] = factory


def provider_names() -> tuple[str, ...]:
    """The names cluster.yaml's ``provider`` may take, in registry order."""
    return tuple(PROVIDERS)


def provider_factory(name: str) -> Callable[..., Any]:
    """What builds provider ``name``, imported now if it is still text."""
    entry = PROVIDERS[name]
    if isinstance(entry, str):
        module, _, attr = entry.partition(":")
        entry = getattr(importlib.import_module(module), attr)
        assert callable(entry)
        PROVIDERS[name] = entry
    return entry


def provider_class(name: str) -> type[ConfigHooks]:
    """The class of provider ``name``, for what it says before any node
    exists (GPUs per node); a plain factory is asked for nothing."""
    factory = provider_factory(name)
    if isinstance(factory, type) and issubclass(factory, ConfigHooks):
        return factory
    return ConfigHooks


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
