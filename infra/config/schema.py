"""cluster.yaml's schema: one pydantic model per section (``Roles``,
``Ports``, ``SshConfig``, ``SetupConfig``, ``JobConfig``, ``FetchConfig``) and
``ClusterConfig``, which holds them and checks what spans sections (roles
against nodes, a mode against its roles).

The sections of one provider live with it: ``gce`` is the gce package's
(infra/providers/gce/config.py), added to the file's keys by infra/config/loader.py
like a plug-in's; ``hosts``, provider ssh's, is infra/config/hosts.py (a
field of ClusterConfig, as its key is not the provider's name). ``ssh`` is
here: every SSH transport logs in with it, whichever provider made the node.

Every model is strict (``Strict``, infra/config/base.py): no unknown key,
no lax type (``steps: "10"`` is refused, not read as 10), and each field's
comment is its documentation. infra/config/loader.py reads the file into them and
turns a validation error into one line; callers import from there.
"""

from __future__ import annotations

import os
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    Field,
    PrivateAttr,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from infra.config.base import Port, Strict, show
from infra.config.durations import parse_duration
from infra.config.hosts import HostConfig, host_shorthand
from infra.config.providers import provider_class, provider_names
from infra.config.storage import StorageConfig
from trainer import catalog

# GCE's rule for instance, firewall and label-value names (RFC 1035).
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?\Z")
# The cluster name is embedded in other GCE names ("tfcluster-<name>-grpc"),
# so it must leave room under GCE's 63-character limit.
_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?\Z")

ROLES = ("ps", "worker", "chief")
# An environment variable name; those tfcluster sets for each task are reserved.
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
RESERVED_ENV = ("TF_CONFIG", "PATH", "PYTHONPATH")
RESERVED_ENV_PREFIX = "TFCLUSTER_"
# A POSIX login name (useradd's limit is 32); it also lands in GCE's
# ``ssh-keys`` metadata as ``user:key``, one per line, so no ':' or newline.
_LOGIN = re.compile(r"^[A-Za-z_][A-Za-z0-9._-]{0,31}\Z")
# setup.python: a command name or a path; no shell syntax, no option.
_PROGRAM = re.compile(r"^[A-Za-z0-9_.+/-]{1,255}\Z")


def check_env_name(name: str) -> str | None:
    """Why ``name`` cannot be set for a job's tasks; None if it can."""
    if not _ENV_NAME.match(name):
        return f"{name[:60]!r} is not a variable name (letters, digits and _, not first a digit)"
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIX):
        return f"{name} is set by tfcluster for every task; choose another name"
    return None


# Linux's limit on one NAME=value string of a process's environment
# (MAX_ARG_STRLEN, 32 pages): a longer one cannot start any process.
ENV_ENTRY_MAX = 131072


def check_env(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be set for a job's tasks; None if it can.
    No environment holds a NUL (the values' file ends each entry with one:
    ``abc\\0PATH=/x`` set PATH, reserved, and broke every task), nor an
    entry past the kernel's limit (every task then failed to start)."""
    if (problem := check_env_name(name)) is not None:
        return problem
    if "\0" in value:
        return f"{name}: its value holds a NUL character, which no environment can"
    if len(f"{name}={value}".encode()) >= ENV_ENTRY_MAX:
        return (
            f"{name}: its value is over {ENV_ENTRY_MAX // 1024} KiB, "
            "more than Linux gives one variable"
        )
    return None


def _as_list(value: Any) -> Any:
    """Roles accept one node or a list of nodes."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return value


NodeList = Annotated[list[str], BeforeValidator(_as_list)]


class Roles(Strict):
    """Which nodes run which TensorFlow tasks. Each: a node name or a list.

    Left out, the whole section is the defaults below. A ``roles:`` that
    names no ps has none: a user who lists a chief and workers has said
    which tasks there are (a ps nobody asked for broke collective
    programs); ``train --mode async`` then asks for one."""

    ps: NodeList = ["pc-1"]  # parameter servers: hold the variables (async mode)
    chief: NodeList = ["pc-1"]  # exactly one: runs the training program, writes results
    worker: NodeList = ["pc-2", "pc-3", "pc-4"]  # compute the steps

    @model_validator(mode="before")
    @classmethod
    def _no_ps_unless_named(cls, data: Any) -> Any:
        if isinstance(data, dict) and data and "ps" not in data:
            return {**data, "ps": []}
        return data


class Ports(Strict):
    """gRPC port of each task type. ps and chief share pc-1 by default, so
    they must differ; the firewall opens exactly these between the nodes."""

    ps: Port = 2222
    worker: Port = 2223
    chief: Port = 2224


class SshConfig(Strict):
    """How tfcluster logs in to the nodes (providers gce and ssh)."""

    # The login on the nodes: a POSIX user name (letters, digits, '.', '_', '-').
    user: str = "tfcluster"
    # Private key; None = a per-cluster ed25519 key that tfcluster creates (mode 0600).
    key_file: str | None = None
    port: Port | Literal[22] = 22
    # Seconds for one TCP connect + handshake.
    connect_timeout: Annotated[float, Field(gt=0)] = 10.0
    # Seconds to keep retrying while a node is still booting (sshd not up yet).
    boot_timeout: Annotated[float, Field(gt=0)] = 300.0

    @field_validator("user")
    @classmethod
    def _user(cls, user: str) -> str:
        if not _LOGIN.match(user):
            raise ValueError(
                f"{show(user)} is not a login name: 1-32 letters, digits, '.', '_' or '-', "
                "starting with a letter or '_'"
            )
        return user


class SetupConfig(Strict):
    """What `up` installs and syncs on every node."""

    # Where tfcluster keeps its venv, code and runs on a node: relative to
    # the login's home, or absolute. "~/x" means the same as "x" (it is
    # rewritten so); "..", "~user" and the home or / itself are refused.
    remote_dir: str = "tfcluster"
    # The interpreter that makes the node's venv: a command name or a path.
    python: str = "python3"
    # Pinned trainer dependencies installed into the node's venv.
    requirements: str = "trainer/requirements.txt"
    # A local folder of wheels uploaded once and installed with pip --no-index
    # (clusters without internet). None = nodes install from PyPI.
    wheelhouse: str | None = None
    # Extra local paths (relative to this file) synced to every node beside trainer/.
    sync: list[str] = []
    # Shell commands run once per node after the install (idempotent by hash).
    commands: list[str] = []

    @field_validator("remote_dir")
    @classmethod
    def _remote_dir(cls, remote_dir: str) -> str:
        # rsync's remote shell expands "~/" but tfcluster's quoted commands
        # would not (they would make a folder named "~"): one meaning only.
        # ("~//x" too is home/x for rsync, not /x.)
        path = remote_dir[2:].lstrip("/") if remote_dir.startswith("~/") else remote_dir
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if (
            not parts
            or ".." in parts
            or path.startswith("~")
            or any(not c.isprintable() for c in path)
        ):
            raise ValueError(
                f"{show(remote_dir)} is not a folder for tfcluster: give a folder relative "
                "to the login's home (tfcluster) or an absolute one, without '..'"
            )
        return posixpath.normpath(path)

    @field_validator("python")
    @classmethod
    def _python(cls, python: str) -> str:
        if not _PROGRAM.match(python) or python.startswith("-"):
            raise ValueError(
                f"{show(python)} is not a command name or path (such as python3.11 or "
                "/usr/bin/python3)"
            )
        return python


class JobConfig(Strict):
    """The jobs: what `train` runs (flags on the command line override), and
    where and with what environment `run` and `exec` run the user's program."""

    model: str = "cnn"  # one of trainer.catalog.MODELS
    mode: str = "async"  # one of trainer.catalog.MODES
    steps: Annotated[int, Field(ge=1)] = 600
    batch_size: Annotated[int, Field(ge=1)] = 128
    learning_rate: Annotated[float, Field(gt=0)] | None = None  # None = the model's default
    checkpoint_every: Annotated[int, Field(ge=1)] = 100
    # MNIST folder on the nodes; None = a synced data folder if any, else download.
    data_dir: str | None = None
    # Extra trainer flags, passed as they are (see `python -m trainer --help`).
    args: list[str] = []
    # `run`/`exec`: the working folder synced to the nodes, where the program
    # runs; relative to this file's folder. None = this file's folder (the
    # embedded default config: the current directory).
    workdir: str | None = None
    # `run`: environment variables for every task of the job.
    env: dict[str, str] = {}
    # `train`/`run` on preemptible nodes: how often a job whose node was
    # preempted is restarted from its last checkpoint (infra/jobs/recovery.py).
    max_restarts: Annotated[int, Field(ge=0, le=100)] = 3

    @field_validator("model")
    @classmethod
    def _model(cls, model: str) -> str:
        if model not in catalog.MODELS:
            raise ValueError(
                f"{show(model)} is not a model; choose one of {', '.join(catalog.MODELS)}"
            )
        return model

    @field_validator("mode")
    @classmethod
    def _mode(cls, mode: str) -> str:
        if mode not in catalog.MODES:
            raise ValueError(
                f"{show(mode)} is not a mode; choose one of {', '.join(catalog.MODE_NAMES)}"
            )
        return mode

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if (problem := check_env(name, value)) is not None:
                raise ValueError(problem)
        return env


@dataclass(frozen=True)
class FetchLimits:
    """What one fetch takes from a node at most (``FetchConfig.limits``):
    what infra/transport/fetch.py and the bucket's runs enforce."""

    max_bytes: int
    max_entries: int
    timeout: float


class FetchConfig(Strict):
    """What a fetch (the end of `train`/`run`, `deploy.py fetch`) takes from a
    node at most: a node is not trusted to send only what it lists
    (infra/transport/fetch.py). The defaults hold a real run folder many times over:
    the convnet's (the largest built-in model) with its 3 checkpoints kept
    is about 2 GB (658 MB a checkpoint, measured) in 13 entries."""

    # Gigabytes (10^9 bytes) the run folder may hold, every file counted
    # (those already here and unchanged too).
    max_gb: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 50.0
    # Files and folders the run folder may hold.
    max_entries: Annotated[int, Field(ge=1)] = 100_000
    # Seconds a node may leave a listing or a read unanswered.
    timeout: Annotated[float, Field(gt=0, allow_inf_nan=False)] = 120.0

    def limits(self) -> FetchLimits:
        return FetchLimits(int(self.max_gb * 1e9), self.max_entries, self.timeout)


def _autostop(value: Any) -> int | None:
    return parse_duration(value)


def _provider(value: Any) -> str:
    """A registered provider's name; refused with the words of a Literal,
    which this field was before providers became plug-ins."""
    names = provider_names()
    if value not in names:
        listed = [repr(n) for n in names]
        expected = ", ".join(listed[:-1]) + " or " + listed[-1] if len(listed) > 1 else listed[0]
        raise PydanticCustomError(
            "literal_error", "Input should be {expected}", {"expected": expected}
        )
    return str(value)


class ClusterConfig(Strict):
    """A whole cluster.yaml."""

    # Names the cluster in GCE labels, firewall rules and local state.
    name: str
    # One of infra/providers' registry (gce, ssh, local, and what a plug-in adds).
    provider: Annotated[str, BeforeValidator(_provider)] = "local"
    nodes: list[str] = ["pc-1", "pc-2", "pc-3", "pc-4"]
    roles: Roles = Roles()
    ports: Ports = Ports()
    # (A provider's own section, gce's or a plug-in's, is added under the
    # provider's name by infra/config/loader.py.)
    ssh: SshConfig = SshConfig()
    # provider ssh: node -> address, "address:port" or {address, port, internal_address}.
    hosts: dict[str, Annotated[HostConfig, BeforeValidator(host_shorthand)]] = {}
    setup: SetupConfig = SetupConfig()
    job: JobConfig = JobConfig()
    fetch: FetchConfig = FetchConfig()
    # Stop every node once no job task has run for this long (45s, 30m, 2h;
    # off by default): infra/cluster/autostop.py. Seconds once validated.
    autostop: Annotated[int | None, BeforeValidator(_autostop)] = None
    # The cluster's bucket (infra/config/storage.py); None: runs stay on the nodes.
    storage: StorageConfig | None = None
    # Folder of this file; relative paths in it are resolved from here. Set by load_config.
    base_dir: Path = Field(default=Path("."), exclude=True)
    # The file as the user named it (--config), set by parse_config: the
    # first word of every problem found in it, also by a provider after
    # loading (infra/config/loader.py in_file). Private: never a key of the file.
    _source: str = PrivateAttr(default="cluster.yaml")

    @model_validator(mode="before")
    @classmethod
    def _empty_sections(cls, data: Any) -> Any:
        # `gce:` with every key under it commented out is YAML's null: the
        # section's defaults, as if it were left out, not "not a dictionary".
        if not isinstance(data, dict):
            return data
        sections = {
            name
            for name, field in cls.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
        }
        return {k: {} if v is None and k in sections else v for k, v in data.items()}

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _CLUSTER_NAME.match(name):
            raise ValueError(
                f"{show(name)} is not a usable cluster name: use 1-40 lowercase letters, digits "
                "and '-', starting with a letter (GCE names it into labels and firewall rules)"
            )
        return name

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, nodes: list[str]) -> list[str]:
        if not nodes:
            raise ValueError("list at least one node, for example [pc-1, pc-2]")
        for node in nodes:
            if not _GCE_NAME.match(node):
                raise ValueError(
                    f"{show(node)} is not a valid node name: lowercase letters, digits and '-', "
                    "starting with a letter, at most 63 characters"
                )
        if len(set(nodes)) != len(nodes):
            raise ValueError("a node is listed twice")
        return nodes

    @model_validator(mode="after")
    def _consistent(self) -> ClusterConfig:
        declared = set(self.nodes)
        for role in ROLES:
            members: list[str] = getattr(self.roles, role)
            for node in members:
                if node not in declared:
                    raise _KeyedError(
                        ("roles", role),
                        f"{show(node)} is not one of the nodes ({', '.join(self.nodes)}); "
                        "add it to 'nodes' or fix the name",
                    )
            if len(set(members)) != len(members):
                raise _KeyedError(("roles", role), "a node is listed twice")
        if len(self.roles.chief) != 1:
            raise _KeyedError(("roles", "chief"), "name exactly one chief node")
        if overlap := set(self.roles.ps) & set(self.roles.worker):
            raise _KeyedError(
                ("roles", "ps"),
                f"{', '.join(sorted(overlap))} is both ps and worker; "
                "a node serves one of the two (the ps would starve the worker)",
            )
        # Whether job.mode has the roles it needs is `train`'s question
        # (Cluster.train_spec): `run` and `status` need no ps.
        ports = self.ports
        if len({ports.ps, ports.worker, ports.chief}) != 3:
            raise _KeyedError(
                ("ports",),
                "ps, worker and chief need three different ports (they can share a node)",
            )
        # What the provider itself needs (ssh: an address for every node).
        if problem := provider_class(self.provider).config_problem(self):
            raise _KeyedError(*problem)
        if unknown := sorted(set(self.hosts) - declared):
            raise _KeyedError(("hosts",), f"{show(unknown[0])} is not one of the nodes")
        return self

    # -- derived views -------------------------------------------------------

    @property
    def source(self) -> str:
        """The file this config was read from, as the user named it."""
        return self._source

    def from_file(self, source: str, base_dir: Path) -> ClusterConfig:
        """This config, as read from ``source`` in ``base_dir``."""
        config = self.model_copy(update={"base_dir": base_dir})
        config._source = source
        return config

    def nodes_of(self, role: str) -> list[str]:
        return list(getattr(self.roles, role))

    def roles_of(self, node: str) -> list[str]:
        return [role for role in ROLES if node in getattr(self.roles, role)]

    def workdir(self) -> Path:
        """job.workdir, resolved from this file's folder (default: that folder)."""
        return self.resolve(self.job.workdir or ".")

    def resolve(self, path: str) -> Path:
        """A path from this file, relative to the file's folder."""
        p = Path(os.path.expanduser(path))
        return p if p.is_absolute() else (self.base_dir / p).resolve()


class _KeyedError(ValueError):
    """A cross-field error that knows which key it is about."""

    def __init__(self, loc: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.loc = loc
        self.message = message
