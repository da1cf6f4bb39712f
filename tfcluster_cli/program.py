"""``deploy.py`` as a process: its version, the signals that end a command
as Ctrl-C does, and its arguments checked as text before click reads them.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Sequence

from infra.errors import ConfigError
from infra.text import node_text
from tfcluster_cli import consoles


def version() -> str:
    """The installed tfcluster's version (pyproject's, once `pip install -e .`
    or `make` ran); a bare checkout run without installing says so."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tfcluster")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def interrupted_by(sig: signal.Signals) -> None:
    """``sig`` ends the command as Ctrl-C does (a sweep stops its trials,
    TensorBoard is stopped). Where it is ignored, it stays ignored."""
    # Only the main thread may set a handler (a test may run us in another).
    main = threading.current_thread() is threading.main_thread()
    if main and signal.getsignal(sig) is signal.SIG_DFL:
        signal.signal(sig, _interrupt)


def check_arguments(argv: Sequence[str]) -> None:
    """Exit with one line (code 2) at an argument that is not UTF-8 text."""
    for i, arg in enumerate(argv, 1):
        # Bytes that are not UTF-8 arrive as surrogates (surrogateescape):
        # the SSH library cannot send them, and stopped a sweep or a run
        # with a traceback once the command was on its way to a node.
        try:
            arg.encode()
        except UnicodeEncodeError:
            shown = arg.encode(errors="surrogateescape").decode(errors="backslashreplace")
            consoles.err_console.print(
                f"error: argument {i} ({node_text(shown[:60])}) is not UTF-8 text; "
                "write it as UTF-8 (check the terminal's locale)",
                style="red", markup=False, soft_wrap=True,
            )  # fmt: skip
            sys.exit(ConfigError.exit_code)
