"""The ``deploy.py`` command group: the commands listed in the order of a
cluster's life, and every error of a command turned into one line and its
exit code (click's usage errors included).
"""

from __future__ import annotations

from typing import Any

import click

from infra.errors import Interrupted, TfclusterError
from infra.text import node_text
from tfcluster_cli import consoles
from tfcluster_cli.errors import EXIT_BUG, fail, write_debug_log

# `--help` lists the commands in the order of a cluster's life, not
# alphabetically. A command missing here is listed after these, by name.
COMMAND_ORDER = (
    "up",
    "status",
    "train",
    "run",
    "sweep",
    "exec",
    "logs",
    "tensorboard",
    "cancel",
    "fetch",
    "runs",
    "report",
    "ssh",
    "stop",
    "start",
    "autostop",
    "down",
    "forget-host",
)

# Commands whose extra arguments go to a program: an unknown option there is
# most often one of the program's, given before `--`. The example of where
# it goes, by command; {option} is the unknown option.
PASSTHROUGH_EXAMPLE = {
    "train": "trainer flags go after --, e.g. `{path} -- {option} ...`",
    "run": "your program's flags go after the command: `{path} -- python prog.py {option} ...`",
    "sweep": "your program's flags go after the command: `{path} -- python prog.py {option} ...`",
}


class TfclusterGroup(click.Group):
    """Turns expected errors into one red line and their exit code."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda n: (rank.get(n, len(rank)), n))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TfclusterError as exc:
            fail(exc)
        except KeyboardInterrupt:
            fail(Interrupted("interrupted"))
        except click.UsageError as exc:
            # click's own usage text is four lines; ours is one, like every
            # other bad input.
            where = exc.ctx.command_path if exc.ctx else "deploy.py"
            message = exc.format_message().rstrip(".")
            name = exc.ctx.command.name if exc.ctx else None
            example = PASSTHROUGH_EXAMPLE.get(name or "")
            if isinstance(exc, click.NoSuchOption) and example:
                message += "; " + example.format(path=where, option=exc.option_name)
            consoles.err_console.print(
                f"error: {where}: {message}; see `{where} --help`",
                style="red",
                markup=False,
                soft_wrap=True,
            )
            raise click.exceptions.Exit(exc.exit_code) from None
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as exc:
            try:
                where = f"details in {write_debug_log()}"
            except OSError as log_error:
                # No log where the state folder cannot be written (TFCLUSTER_HOME
                # under a file): the bug and why on the one line instead.
                where = f"{type(exc).__name__}: {exc}; no debug log: {log_error}"
            consoles.err_console.print(
                f"error: unexpected failure (a bug in tfcluster); {node_text(where)}",
                style="red",
                markup=False,
                soft_wrap=True,
            )
            ctx.exit(EXIT_BUG)
