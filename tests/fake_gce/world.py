"""What every resource part of one fake GCE shares: its one lock (each part
takes it around its tables, and a part may call another while holding it),
its settings (``Latency``, the backend, the zones, the longest
operations.wait), the record of its own failures, and the clock its
operation threads sleep on (``sleep`` ends with ``Closing`` once the fake
stops).

The parts (operations.py, faults.py, instances.py, firewalls.py, ...) each
hold this ``World``; ``FakeGce`` (server.py) makes it and lets tests change
its settings between calls.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.fake_gce.backend import InstanceBackend

DEFAULT_ZONES = (
    "us-central1-a",
    "us-central1-b",
    "us-central1-c",
    "us-central1-f",
    "europe-west1-b",
)


@dataclass
class Latency:
    """Seconds each state lasts. Mutable: a test may change it between calls."""

    provision: float = 0.0  # PROVISIONING after insert; the insert operation ends with it
    staging: float = 0.0  # STAGING after create, before RUNNING
    start: float = 0.0  # STAGING after start; the start operation ends at RUNNING
    stop: float = 0.0  # STOPPING before TERMINATED
    delete: float = 0.0  # STOPPING before the instance is gone
    firewall: float = 0.0  # any firewall operation
    metadata: float = 0.0  # setLabels / setMetadata operations
    host_keys: float = 0.0  # RUNNING before the guest agent publishes its host keys
    # Instance name -> its own PROVISIONING time (a slow node among fast ones).
    per_instance: dict[str, float] = field(default_factory=dict)

    def provision_of(self, name: str) -> float:
        return self.per_instance.get(name, self.provision)


class Closing(Exception):
    """The fake is shutting down: operation threads end quietly."""


class World:
    def __init__(
        self,
        latency: Latency,
        backend: InstanceBackend,
        zones: Sequence[str],
        wait_max_s: float,
    ) -> None:
        self.latency = latency
        self.backend = backend
        self.zones = list(zones)
        self.wait_max_s = wait_max_s
        # Exceptions on operation threads that are not modelled API
        # behaviour (a backend hook failed, a bug here): tests assert none.
        self.internal_errors: list[BaseException] = []
        self.lock = threading.RLock()
        self.closing = threading.Event()

    def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on an operation thread; ``Closing`` if the fake stops."""
        if seconds > 0 and self.closing.wait(seconds):
            raise Closing
        if self.closing.is_set():
            raise Closing
