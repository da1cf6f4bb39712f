"""Google's Cloud Storage modules, imported on first use.

Loading google-cloud-storage takes about a second; most commands never
touch a bucket, and a cluster without ``storage`` never should. So this
package names these stand-ins, and the real modules load when the first
client or exception class is reached (as infra/providers/gce/_google.py
does for Compute Engine). mypy sees the real modules.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any


class _OnFirstUse:
    """A module, imported when one of its attributes is first read."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


if TYPE_CHECKING:
    from google.api_core import exceptions as api_exceptions
    from google.auth import exceptions as auth_exceptions
    from google.cloud.storage import client as storage
    from google.cloud.storage import retry as storage_retry
else:
    api_exceptions = _OnFirstUse("google.api_core.exceptions")
    auth_exceptions = _OnFirstUse("google.auth.exceptions")
    storage = _OnFirstUse("google.cloud.storage.client")
    storage_retry = _OnFirstUse("google.cloud.storage.retry")

__all__ = ["api_exceptions", "auth_exceptions", "storage", "storage_retry"]
