"""The options several ``deploy.py`` commands share (and ``pass_cluster``,
which gives each its ``Cluster``), and the parsing of option values that
is more than a click type: ``train``'s options that
override cluster.yaml's ``job.*`` (their help shows the value in effect),
``--no-recover``, ``--workdir``, ``--detach``, ``--dest``, durations and
``--env KEY=VALUE``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import click

from infra.cluster.api import Cluster
from infra.errors import ConfigError

# Hands each command the Cluster that deploy.py's group made of --config.
pass_cluster = click.make_pass_decorator(Cluster)

recover_option = click.option(
    "--no-recover",
    is_flag=True,
    help="Do not restart the job when a (Spot) node is preempted; by default a preempted "
    "node is started again and the job goes on from its last checkpoint.",
)


class JobDefault(click.Option):
    """A `train` option that overrides cluster.yaml's ``job.<key>``: it has
    no default of its own (None keeps the config's), and its help shows the
    effective one, read from the cluster.yaml in use."""

    # Shown for a key whose config value is None.
    NONE_MEANS: ClassVar[dict[str, str]] = {
        "learning_rate": "the model's own",
        "data_dir": "MNIST synced or downloaded",
    }

    def __init__(self, *args: Any, job_key: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.job_key = job_key

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        cluster = ctx.find_object(Cluster)
        if record is None or cluster is None:
            return record
        value = getattr(cluster.config.job, self.job_key)
        shown = self.NONE_MEANS.get(self.job_key, "none") if value is None else value
        extra = f"[default: {shown}, from job.{self.job_key}]"
        return record[0], f"{record[1]}  {extra}" if record[1] else extra


def job_option(flag: str, key: str, **kwargs: Any) -> Any:
    return click.option(flag, cls=JobDefault, job_key=key, **kwargs)


workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="The working folder synced to the nodes, where COMMAND runs (default: job.workdir, "
    "else the folder of cluster.yaml; without --config, the current folder).",
)


detach_option = click.option(
    "--detach", is_flag=True, help="Start the job and return at once."
)


def dest_option(help: str) -> Any:
    """``--dest FOLDER``: where a command brings results home."""
    return click.option("--dest", type=click.Path(file_okay=False, path_type=Path), help=help)


def env_pairs_option(help: str) -> Any:
    """``--env KEY=VALUE``, repeatable, as ``env_pairs`` (``env_option`` parses them)."""
    return click.option("--env", "env_pairs", multiple=True, metavar="KEY=VALUE", help=help)


def duration_option(key: str, text: str) -> int | None:
    """A duration option (``30m``, ``2h``, ``off``) in seconds; None: off."""
    from infra.config.durations import DurationError, parse_duration

    try:
        return parse_duration(text)
    except DurationError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def env_option(pairs: tuple[str, ...]) -> dict[str, str]:
    """``--env KEY=VALUE`` options as a mapping (the last of a key wins)."""
    env: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {pair[:60]!r}: write KEY=VALUE")
        env[key] = value
    return env


# `run` and `exec`: what infra/jobs/tf_noise.py leaves out is shown too.
raw_option = click.option(
    "--raw",
    is_flag=True,
    help="Show TensorFlow's load-time log too (oneDNN, CPU features, CUDA not found: "
    "left out by default).",
)
