"""The ``google.*`` modules the provider calls (and ``requests``, which
they ride on), imported on first use.

Loading the Compute client takes seconds. The registry imports a
provider's class to ask it what it says from cluster.yaml alone (its
config problems while the file is validated, GPUs per node), which needs
none of Google's code: so the provider's modules name these stand-ins,
and the real modules load when the first API call, client or exception
class is reached. mypy sees the real modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class _OnFirstUse:
    """A module, imported when one of its attributes is first read."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        # import_module is thread-safe and, once imported, a dict lookup.
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    import requests
    from google.api_core import client_options
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud import compute_v1
else:
    api_exceptions = _OnFirstUse("google.api_core.exceptions")
    auth_exceptions = _OnFirstUse("google.auth.exceptions")
    client_options = _OnFirstUse("google.api_core.client_options")
    compute_v1 = _OnFirstUse("google.cloud.compute_v1")
    requests = _OnFirstUse("requests")

__all__ = ["api_exceptions", "auth_exceptions", "client_options", "compute_v1", "requests"]
