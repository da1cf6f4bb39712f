"""The one exception root of tfcluster and its small, documented subclasses.

Every error a user can cause or fix is one of these. The CLI prints
``str(error)`` as one red line (plus ``hint`` when there is one) and exits
with the class's ``exit_code``; anything else is a bug, and the CLI writes
its traceback to a debug log and prints that log's path instead.

Exit codes are distinct per class so that scripts can tell "fix your
cluster.yaml" (2) from "the cloud said no" (4, 5) from "training failed"
(the chief's own code, see ``JobFailed``).
"""

from __future__ import annotations

from collections.abc import Mapping


class TfclusterError(Exception):
    """Root of every expected error. Exit code 1."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


class ConfigError(TfclusterError):
    """cluster.yaml (or a flag) is wrong: the message names file, key, value
    and the fix. Exit code 2, the same code click uses for bad usage.
    ``more``: the file's other mistakes, each a line of the same kind, so
    that one run shows them all."""

    exit_code = 2

    def __init__(
        self, message: str, *, hint: str | None = None, more: list[str] | None = None
    ) -> None:
        super().__init__(message, hint=hint)
        self.more = list(more or [])


class StateError(TfclusterError):
    """The cluster is not in a state the command needs (for example ``train``
    before ``up``, or a node stopped). Exit code 3."""

    exit_code = 3


class ProviderError(TfclusterError):
    """The cloud API (or the local process table) refused or failed an
    operation after retries. Exit code 4."""

    exit_code = 4


class CapacityError(ProviderError):
    """No zone in ``gce.zones`` could supply the nodes (stockout or quota);
    the message lists every zone's reason. Exit code 5."""

    exit_code = 5


class CredentialsError(ProviderError):
    """No usable Google credentials or project. Exit code 6."""

    exit_code = 6


class RemoteError(TfclusterError):
    """A command over SSH failed on one or more nodes; the message names
    each node and why. Exit code 7."""

    exit_code = 7


class HostKeyChanged(RemoteError):
    """A node presented a host key other than the one pinned on first
    contact. Exit code 8: refuse, never silently accept."""

    exit_code = 8


class UnsafeRemoteEntry(RemoteError):
    """A node sent a file that could land outside the destination of a
    fetch (a name with ``/`` or ``..``, a symlink, a device): refused, and
    nothing written outside. Exit code 7, as any RemoteError; a class of
    its own so that the fetch at the end of ``train`` fails on it rather
    than warning."""


class FetchLimitExceeded(RemoteError):
    """A fetch met one of cluster.yaml's ``fetch`` limits (its size, its
    number of entries, a node silent too long): the message names the node
    and the file, and no partial file is left under its own name. Exit
    code 7; at the end of a job, a warning (the run stays on the node)."""


class JobFailed(TfclusterError):
    """The job failed. Its exit code is the chief's own (or the failing
    task's), so that ``deploy.py train`` and ``run`` exit as the program
    did. ``details``: the last lines of the failed tasks' logs (node text:
    shown as data)."""

    def __init__(
        self,
        message: str,
        *,
        exit_code: int = 9,
        hint: str | None = None,
        details: list[str] | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.details = list(details or [])
        # A chief killed by a signal has no exit code of its own; 9 then.
        self.exit_code = exit_code if 0 < exit_code < 256 else 9


class Interrupted(TfclusterError):
    """The user pressed Ctrl-C; what was started has been cleaned up or is
    findable by its labels. Exit code 130, as a shell gives for SIGINT."""

    exit_code = 130


def combine_errors(failures: Mapping[str, RemoteError]) -> RemoteError:
    """One error for several nodes; a changed host key wins (its exit code)."""
    for exc in failures.values():
        if isinstance(exc, HostKeyChanged):
            return exc
    if len(failures) == 1:
        return next(iter(failures.values()))
    message = "; ".join(str(failures[n]) for n in sorted(failures))
    hint = next((e.hint for e in failures.values() if e.hint), None)
    return RemoteError(message, hint=hint)
