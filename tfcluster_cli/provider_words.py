"""What the commands say of a provider's nodes, worded here from what the
provider says they are (``Capabilities``): the library tells what `down`
does to them, the command line says it. A provider never words the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from infra.providers.base import Capabilities


@dataclass(frozen=True)
class DownWords:
    """``down``'s words for one kind of node."""

    verb: str  # what it does to one node, as a plan line's verb ("delete  pc-1")
    question: str  # asked before it acts
    done: str  # what it did; ``{name}`` is the cluster's name


# Nodes tfcluster made: `down` deletes them, and nothing is left to pay for.
_DELETE = DownWords(
    "delete",
    "delete these, with their disks?",
    "deleted {name}: nothing left running or billed",
)
# The user's own machines: "delete" would be a lie; `down` stops
# tfcluster's tasks on them and leaves the machines and their files alone.
_RELEASE = DownWords(
    "release",
    "stop tfcluster's tasks on these hosts (the machines and their files stay)?",
    "released {name}: no tfcluster task runs on its hosts; "
    "the machines and their files are as they were",
)


def down_words(capabilities: Capabilities) -> DownWords:
    return _RELEASE if capabilities.existing_hosts else _DELETE
