"""This machine's Cloud Storage client for a cluster's ``storage`` section,
and Google's errors as tfcluster's: a missing bucket or a refused
permission is a ConfigError (exit 2: cluster.yaml names something that
will not work), unusable credentials a CredentialsError (6), any other
failure of the service a ProviderError (4). Each is one line."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from infra.config.storage import StorageConfig
from infra.errors import ConfigError, CredentialsError, ProviderError, TfclusterError
from infra.storage import transfer
from infra.storage._gcs import api_exceptions, auth_exceptions

if TYPE_CHECKING:
    from google.cloud.storage.client import Client


def open_client(storage: StorageConfig, base: Path) -> Client:
    """A client with ``storage.credentials`` at ``storage``'s endpoint."""
    spec = storage.credentials
    if spec not in ("adc", "anonymous"):
        path = Path(spec).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise CredentialsError(
                f"storage.credentials: {path} does not exist; give the path of a "
                "service-account JSON key, or use credentials: adc"
            )
        spec = str(path)
    with errors("opening Cloud Storage"):
        return transfer.make_client(storage.api_endpoint(), spec)


@contextlib.contextmanager
def errors(what: str) -> Iterator[None]:
    """Google's exceptions inside as one-line tfcluster errors."""
    try:
        yield
    except TfclusterError:
        raise
    except auth_exceptions.DefaultCredentialsError:
        raise CredentialsError(
            f"{what}: no Google application default credentials",
            hint="run `gcloud auth application-default login`, or set storage.credentials "
            "to a service-account key file",
        ) from None
    except (auth_exceptions.GoogleAuthError, ValueError) as exc:
        raise CredentialsError(f"{what}: unusable credentials: {_first_line(exc)}") from None
    except api_exceptions.NotFound as exc:
        raise ConfigError(f"{what}: {_first_line(exc)}") from None
    except api_exceptions.GoogleAPICallError as exc:
        raise ProviderError(f"{what}: {_first_line(exc)}") from None
    except (api_exceptions.RetryError, OSError) as exc:
        # The endpoint does not answer; through the client's retries, once
        # they ran out, as RetryError (neither an API error nor an OSError).
        cause = exc.cause if isinstance(exc, api_exceptions.RetryError) else exc
        if isinstance(cause, api_exceptions.GoogleAPICallError):  # 503s to the end
            raise ProviderError(f"{what}: {_first_line(cause)}") from None
        raise ProviderError(
            f"{what}: no answer from Cloud Storage ({transfer.error_line(cause or exc)})",
            hint="check storage.endpoint (or $STORAGE_EMULATOR_HOST) and this machine's network",
        ) from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
