"""A fake Compute Engine REST API for tests (see ``server.py``)."""

from tests.fake_gce.server import (
    MUTATING,
    Addresses,
    ApiError,
    Call,
    FakeGce,
    InstanceBackend,
    Latency,
    OpFailure,
    running_names,
)

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
