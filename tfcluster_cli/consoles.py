"""The consoles tfcluster prints to, and how log records reach the terminal.

The other modules of this package print to ``consoles.console`` (and
``consoles.err_console``), read when they print: replacing this module's
attribute (a test's terminal) redirects all of them at once. deploy.py's
commands print to the same objects, imported by name.
"""

from __future__ import annotations

import logging
import sys

import click
from rich.console import Console, ConsoleDimensions
from rich.logging import RichHandler

from infra.text import node_text

# Piped, redirected or in CI, output is not cut to a width: rich's 80
# columns would split a job line or a path and cut run ids in tables
# ("cnn-as…"); a script or a log wants each line whole.
UNWRAPPED_WIDTH = 100_000


class _Console(Console):
    """A rich Console that wraps to the terminal's width on a terminal and
    not at all anywhere else (a pipe, a file, CI, click's CliRunner)."""

    @property
    def size(self) -> ConsoleDimensions:
        if not self.is_terminal:
            return ConsoleDimensions(UNWRAPPED_WIDTH, 25)
        return Console.size.fget(self)  # type: ignore[attr-defined]

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


# Names, commands and node output are data: what tfcluster prints of them is
# printed with markup off (or escaped, or as Text), and no `:name:` code in
# them may turn into an emoji, with markup or without.
console = _Console(highlight=False, emoji=False)
err_console = _Console(stderr=True, highlight=False, emoji=False)
# Log records are rendered as a grid as wide as the console: their own
# console keeps a width, so that a warning is not padded to UNWRAPPED_WIDTH.
log_console = Console(stderr=True, highlight=False, emoji=False)


def as_invoked(text: str) -> str:
    """``text`` with the commands it suggests (`` `deploy.py logs` ``) named
    as the user typed the program: `` `tfcluster logs` `` when run as
    ``tfcluster`` (the library's messages say ``deploy.py``)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None or ctx.find_root().info_name != "tfcluster":
        return text  # deploy.py (or click's `cli` in tests): as written
    return text.replace("`deploy.py ", "`tfcluster ").replace("`deploy.py`", "`tfcluster`")


def setup_logging(verbose: bool) -> None:
    logger = logging.getLogger("tfcluster")
    handler: logging.Handler
    if log_console.is_terminal:
        handler = RichHandler(console=log_console, show_time=False, show_path=False, markup=False)
    else:
        # Piped, redirected or in CI: one whole line per record, as every
        # other line (rich's grid would wrap it at 80 columns).
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
    handler.addFilter(clean_record)
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    logger.propagate = False


def clean_record(record: logging.LogRecord) -> bool:
    """Warnings quote node errors (a failed fetch, an unreachable node):
    no terminal control of theirs reaches the terminal."""
    record.msg, record.args = as_invoked(node_text(record.getMessage())), None
    return True
