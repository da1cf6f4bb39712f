"""A fake Compute Engine REST API for tests: ``FakeGce`` (server.py, which
maps the package: one module per resource)."""

from tests.fake_gce.api import MUTATING, ApiError, Call, OpFailure
from tests.fake_gce.backend import Addresses, InstanceBackend
from tests.fake_gce.server import FakeGce, running_names
from tests.fake_gce.world import Latency

__all__ = [
    "MUTATING",
    "Addresses",
    "ApiError",
    "Call",
    "FakeGce",
    "InstanceBackend",
    "Latency",
    "OpFailure",
    "running_names",
]
