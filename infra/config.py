"""cluster.yaml, typed and strict.

Every key has a type and a comment; unknown keys are rejected with a
"did you mean", and every mistake becomes one ``ConfigError`` line that
names the file, the key, the value and the fix. ``load_config`` is the only
way in; the rest of tfcluster only ever sees a validated ``ClusterConfig``.

With no file at all, ``default_config()`` is the embedded local cluster
(roles as processes on this machine), so a new user needs no cloud.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from infra.errors import ConfigError

# GCE's rule for instance, firewall and label-value names (RFC 1035).
_GCE_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# The cluster name is embedded in other GCE names ("tfcluster-<name>-grpc"),
# so it must leave room under GCE's 63-character limit.
_CLUSTER_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,38}[a-z0-9])?$")
_ZONE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")

PROVIDERS = ("gce", "ssh", "local")
MODELS = ("cnn", "convnet", "dae", "sdae")
MODES = ("async", "sync", "average", "single")
ROLES = ("ps", "worker", "chief")


def _as_list(value: Any) -> Any:
    """Roles accept one node or a list of nodes."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return value


NodeList = Annotated[list[str], BeforeValidator(_as_list)]
Port = Annotated[int, Field(ge=1024, le=65535)]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo must never silently fall back to a
    # default that provisions something else (and costs money).
    model_config = ConfigDict(extra="forbid", frozen=True)


class Roles(_Strict):
    """Which nodes run which TensorFlow tasks. Each: a node name or a list."""

    ps: NodeList = ["pc-1"]  # parameter servers: hold the variables (async mode)
    chief: NodeList = ["pc-1"]  # exactly one: runs the training program, writes results
    worker: NodeList = ["pc-2", "pc-3", "pc-4"]  # compute the steps


class Ports(_Strict):
    """gRPC port of each task type. ps and chief share pc-1 by default, so
    they must differ; the firewall opens exactly these between the nodes."""

    ps: Port = 2222
    worker: Port = 2223
    chief: Port = 2224


class Accelerator(_Strict):
    """GPUs per node (GCE guestAccelerators)."""

    type: str  # for example nvidia-tesla-t4, nvidia-l4
    count: Annotated[int, Field(ge=1, le=8)] = 1


class GceConfig(_Strict):
    """Compute Engine settings (provider: gce)."""

    # Project id; default: $GOOGLE_CLOUD_PROJECT, then the ADC project.
    project: str | None = None
    # Ordered: the first zone is preferred, the rest are tried on stockout or quota.
    zones: list[str] = ["us-central1-a", "us-central1-b", "us-central1-f"]
    # 2 vCPU / 8 GB: TensorFlow plus a ps or worker fit with room to spare.
    machine_type: str = "e2-standard-2"
    # A family resolves to the newest image of that family at create time.
    image: str = "projects/debian-cloud/global/images/family/debian-12"
    disk_gb: Annotated[int, Field(ge=10, le=65536)] = 20
    disk_type: str = "pd-balanced"
    # Spot VMs: far cheaper, may be stopped by GCE at any time (`up` restarts them).
    preemptible: bool = False
    network: str = "default"
    subnetwork: str | None = None
    # Who may reach SSH (port 22). Narrow this to your own address/32.
    ssh_source_ranges: list[str] = ["0.0.0.0/0"]
    # Compute API endpoint; None = Google's. Emulators and tests set http://127.0.0.1:PORT.
    api_endpoint: str | None = None
    # "adc" (gcloud auth application-default login), "anonymous" (emulators only),
    # or the path of a service-account JSON key file.
    credentials: str = "adc"
    accelerator: Accelerator | None = None
    # Upper bound, seconds, on waiting for any one Compute operation.
    operation_timeout: Annotated[float, Field(gt=0)] = 600.0
    # Extra labels on every instance (cost attribution).
    labels: dict[str, str] = {}

    @field_validator("zones")
    @classmethod
    def _zones(cls, zones: list[str]) -> list[str]:
        if not zones:
            raise ValueError("list at least one zone, for example [us-central1-a]")
        for zone in zones:
            if not _ZONE.match(zone):
                raise ValueError(f"{zone!r} is not a zone name; zones look like us-central1-a")
        if len(set(zones)) != len(zones):
            raise ValueError("a zone is listed twice")
        return zones

    @field_validator("ssh_source_ranges")
    @classmethod
    def _ranges(cls, ranges: list[str]) -> list[str]:
        for cidr in ranges:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR range such as 203.0.113.7/32") from None
        return ranges

    @field_validator("api_endpoint")
    @classmethod
    def _endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not re.match(r"^https?://[^/]+", endpoint):
            raise ValueError(f"{endpoint!r} is not a URL such as http://127.0.0.1:8089")
        return endpoint


class SshConfig(_Strict):
    """How tfcluster logs in to the nodes (providers gce and ssh)."""

    user: str = "tfcluster"
    # Private key; None = a per-cluster ed25519 key that tfcluster creates (mode 0600).
    key_file: str | None = None
    port: Port | Literal[22] = 22
    # Seconds for one TCP connect + handshake.
    connect_timeout: Annotated[float, Field(gt=0)] = 10.0
    # Seconds to keep retrying while a node is still booting (sshd not up yet).
    boot_timeout: Annotated[float, Field(gt=0)] = 300.0


class HostConfig(_Strict):
    """One existing machine (provider: ssh)."""

    address: str  # where this machine reaches it over SSH
    port: Port | Literal[22] = 22
    # Where the other nodes reach it (TF_CONFIG); default: address.
    internal_address: str | None = None


def _host(value: Any) -> Any:
    """``pc-1: 10.0.0.5`` or ``pc-1: 10.0.0.5:2201`` as shorthand."""
    if isinstance(value, str):
        host, sep, port = value.rpartition(":")
        if sep and port.isdigit():
            return {"address": host, "port": int(port)}
        return {"address": value}
    return value


class SetupConfig(_Strict):
    """What `up` installs and syncs on every node."""

    # Where tfcluster keeps its venv, code and runs on a node (relative to the login's home).
    remote_dir: str = "tfcluster"
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


class JobConfig(_Strict):
    """The training job `train` runs; flags on the command line override."""

    model: Literal["cnn", "convnet", "dae", "sdae"] = "cnn"
    mode: Literal["async", "sync", "average", "single"] = "async"
    steps: Annotated[int, Field(ge=1)] = 600
    batch_size: Annotated[int, Field(ge=1)] = 128
    learning_rate: Annotated[float, Field(gt=0)] | None = None  # None = the model's default
    checkpoint_every: Annotated[int, Field(ge=1)] = 100
    # MNIST folder on the nodes; None = a synced data folder if any, else download.
    data_dir: str | None = None
    # Extra trainer flags, passed as they are (see `python -m trainer --help`).
    args: list[str] = []


class ClusterConfig(_Strict):
    """A whole cluster.yaml."""

    # Names the cluster in GCE labels, firewall rules and local state.
    name: str
    provider: Literal["gce", "ssh", "local"] = "local"
    nodes: list[str] = ["pc-1", "pc-2", "pc-3", "pc-4"]
    roles: Roles = Roles()
    ports: Ports = Ports()
    gce: GceConfig = GceConfig()
    ssh: SshConfig = SshConfig()
    # provider ssh: node -> address, "address:port" or {address, port, internal_address}.
    hosts: dict[str, Annotated[HostConfig, BeforeValidator(_host)]] = {}
    setup: SetupConfig = SetupConfig()
    job: JobConfig = JobConfig()
    # Folder of this file; relative paths in it are resolved from here. Set by load_config.
    base_dir: Path = Field(default=Path("."), exclude=True)

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not _CLUSTER_NAME.match(name):
            raise ValueError(
                f"{name!r} is not a usable cluster name: use 1-40 lowercase letters, digits "
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
                    f"{node!r} is not a valid node name: lowercase letters, digits and '-', "
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
                        f"{node!r} is not one of the nodes ({', '.join(self.nodes)}); "
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
        if self.job.mode == "async" and not self.roles.ps:
            raise _KeyedError(
                ("job", "mode"), "async mode needs a ps node: add roles.ps or use mode sync"
            )
        if self.job.mode in ("async", "sync", "average") and not self.roles.worker:
            raise _KeyedError(("roles", "worker"), f"mode {self.job.mode} needs worker nodes")
        ports = self.ports
        if len({ports.ps, ports.worker, ports.chief}) != 3:
            raise _KeyedError(
                ("ports",),
                "ps, worker and chief need three different ports (they can share a node)",
            )
        if self.provider == "ssh":
            missing = [n for n in self.nodes if n not in self.hosts]
            if missing:
                raise _KeyedError(
                    ("hosts",),
                    f"provider ssh needs an address for every node; missing {', '.join(missing)}",
                )
        if unknown := sorted(set(self.hosts) - declared):
            raise _KeyedError(("hosts",), f"{', '.join(unknown)} is not one of the nodes")
        return self

    # -- derived views -------------------------------------------------------

    def nodes_of(self, role: str) -> list[str]:
        return list(getattr(self.roles, role))

    def roles_of(self, node: str) -> list[str]:
        return [role for role in ROLES if node in getattr(self.roles, role)]

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


# -- loading -----------------------------------------------------------------

DEFAULT_LOCAL_YAML = """\
# The embedded default: a cluster of local processes, no cloud needed.
name: local
provider: local
nodes: [pc-1, pc-2, pc-3]
roles:
  ps: pc-1
  chief: pc-1
  worker: [pc-2, pc-3]
job:
  model: cnn
  mode: async
  steps: 400
  batch_size: 128
  checkpoint_every: 200
"""


def default_config() -> ClusterConfig:
    """The embedded local cluster (examples/local.yaml says the same)."""
    return parse_config(yaml.safe_load(DEFAULT_LOCAL_YAML), source="<embedded local cluster>")


def load_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster.yaml; every problem is one ConfigError line."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{file}: no such file; pass --config with an existing cluster.yaml "
            "(examples/ has some)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read it: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{file}{where}: invalid YAML: {problem}") from None
    return parse_config(data, source=str(file), base_dir=file.resolve().parent)


def parse_config(data: Any, *, source: str, base_dir: Path | None = None) -> ClusterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys (name, provider, nodes, ...)")
    try:
        config = ClusterConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_one_line(source, exc)) from None
    return config.model_copy(update={"base_dir": base_dir or Path.cwd()})


def _one_line(source: str, exc: ValidationError) -> str:
    """The first validation problem as 'file: key: problem; fix'."""
    # A misspelt key also makes its correctly spelt twin "missing": report the
    # misspelling, which is the actual mistake.
    err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]
    loc = tuple(str(part) for part in err["loc"])
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, _KeyedError):
        return f"{source}: {'.'.join(ctx_error.loc)}: {ctx_error.message}"
    key = ".".join(loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        return f"{source}: {key}: unknown key{_did_you_mean(loc)}"
    if kind == "missing":
        return f"{source}: {key}: required key is missing"
    value = err.get("input")
    message = str(err["msg"])
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        return f"{source}: {key}: {message}"
    if kind == "literal_error":
        return f"{source}: {key}: {value!r} is not allowed; {message.lower()}"
    return f"{source}: {key}: {value!r}: {message}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (Optional, dict values, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: Sequence[str]) -> str:
    """'; did you mean 'zones'?' from the keys allowed where the unknown one is."""
    model: type[BaseModel] = ClusterConfig
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        if field is None:
            continue  # a mapping key such as a node name under hosts
        inner = _model_in(field.annotation)
        if inner is None:
            return ""
        model = inner
    fields = [name for name in model.model_fields if name != "base_dir"]
    close = difflib.get_close_matches(loc[-1], fields, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; known keys here: {', '.join(fields)}"
