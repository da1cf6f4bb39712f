"""cluster.yaml, typed and strict.

Every key has a type and a comment; unknown keys are rejected with a
"did you mean", and every mistake becomes one ``ConfigError`` line that
names the file, the key, the value and the fix. ``load_config`` is the only
way in; the rest of tfcluster only ever sees a validated ``ClusterConfig``.

With no file at all, ``default_config()`` is the embedded local cluster
(roles as processes on this machine), so a new user needs no cloud.

This module reads: the file (bounded, UTF-8), the YAML (no duplicate key,
no alias bomb), the validation's errors as one line with a "did you mean".
The schema itself, one model per section, is infra/config/schema.py; its
names that callers use are imported from here (``__all__``). A provider's
own section (gce's, a plug-in's) comes from the provider and is added to
the keys here, for the providers the file uses.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import os
import re
import stat
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError, create_model

from infra.config.base import show
from infra.config.providers import provider_names, provider_sections
from infra.config.schema import ClusterConfig, SshConfig, _KeyedError, check_env, check_env_name
from infra.errors import ConfigError

__all__ = [
    "ClusterConfig",
    "SshConfig",
    "check_env",
    "check_env_name",
    "default_config",
    "load_config",
    "parse_config",
    "parse_yaml",
    "read_config_text",
]

# cluster.yaml is a few KB; these bounds keep a wrong --config (a device,
# a pipe, a huge file) or a YAML alias bomb from hanging or eating memory.
MAX_CONFIG_BYTES = 1 << 20
MAX_YAML_VALUES = 100_000  # after alias expansion
MAX_YAML_DEPTH = 50


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
    return parse_config(
        parse_yaml(DEFAULT_LOCAL_YAML, "<embedded local cluster>"),
        source="<embedded local cluster>",
    )


def load_config(path: str | os.PathLike[str]) -> ClusterConfig:
    """Read and validate a cluster.yaml; every problem is one ConfigError line."""
    file = Path(path)
    data = parse_yaml(read_config_text(file), str(file))
    return parse_config(data, source=str(file), base_dir=file.resolve().parent)


def read_config_text(file: Path) -> str:
    """The file's text: a regular file, at most MAX_CONFIG_BYTES, UTF-8."""
    try:
        # The type first: opening a FIFO would block, /dev/zero never ends.
        if not stat.S_ISREG(file.stat().st_mode):
            raise ConfigError(f"{file}: not a regular file; pass --config with a cluster.yaml")
        # O_NONBLOCK: should a FIFO replace the file in between, open does
        # not wait for a writer, and fstat below refuses it.
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise ConfigError(
            f"{file}: no such file; pass --config with an existing cluster.yaml "
            "(examples/ has some)"
        ) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        try:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"{file}: not a regular file; pass --config with a cluster.yaml")
            blob = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{file}: cannot read it: {exc.strerror}") from None
    if len(blob) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{file}: larger than 1 MB; a cluster.yaml is a few KB")
    try:
        return blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{file}: not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def parse_yaml(text: str, source: str) -> Any:
    """YAML to data, refusing duplicate keys and runaway aliases; one line per error."""
    loader: yaml.SafeLoader | None = None
    try:
        # Made inside the try: its reader refuses a control character (ESC,
        # NUL) as it is made, a YAMLError like any other.
        loader = yaml.SafeLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_yaml_tree(node, source)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ConfigError(f"{source}{where}: invalid YAML: {_cut(problem, 100)}") from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid YAML: nested too deeply") from None
    except ValueError as exc:  # int() of a number with thousands of digits
        raise ConfigError(f"{source}: invalid YAML: {_cut(str(exc), 100)}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_yaml_tree(root: yaml.Node, source: str) -> None:
    """Duplicate keys (YAML would keep the last silently), aliases that
    refer to their own container, and alias expansion beyond
    MAX_YAML_VALUES (a few hundred bytes can expand to billions of values):
    sizes are counted once per node, so a bomb is caught without expanding it."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def where(node: yaml.Node) -> str:
        return f"{source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"

    def size(node: yaml.Node, depth: int) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise ConfigError(f"{where(node)}: an alias refers to the value that contains it")
        if depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{where(node)}: nested more than {MAX_YAML_DEPTH} levels deep")
        active.add(key)
        total = 1
        if isinstance(node, yaml.ScalarNode):
            try:
                node.value.encode()
            except UnicodeEncodeError:
                # "\ud800" in double quotes: a string no file, API or node
                # can take (up --dry-run once crashed on it in gce.metadata).
                raise ConfigError(
                    f"{where(node)}: a lone surrogate (\\ud800-\\udfff) is not text; "
                    "write the character itself"
                ) from None
        if isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            for key_node, value_node in node.value:
                if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
                    ident = (key_node.tag, key_node.value)
                    if ident in seen:
                        raise ConfigError(
                            f"{where(key_node)}: duplicate key {show(key_node.value)} "
                            "(the last would silently win); keep one"
                        )
                    seen.add(ident)
                total += size(key_node, depth + 1) + size(value_node, depth + 1)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item, depth + 1) for item in node.value)
        active.discard(key)
        if total > MAX_YAML_VALUES:
            raise ConfigError(
                f"{where(node)}: its aliases expand to more than {MAX_YAML_VALUES} values; "
                "write the values out"
            )
        sizes[key] = total
        return total

    size(root, 0)


def parse_config(data: Any, *, source: str, base_dir: Path | None = None) -> ClusterConfig:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping of keys (name, provider, nodes, ...)")
    model = _cluster_model(data)
    try:
        config = model.model_validate(data)
    except ValidationError as exc:
        first, *more = _lines(source, exc, model)
        raise ConfigError(first, more=more) from None
    return config.from_file(source, base_dir or Path.cwd())


@contextlib.contextmanager
def in_file(config: ClusterConfig) -> Iterator[None]:
    """A ConfigError raised inside ("gce.image: ...") named after the file
    first, as every problem ``parse_config`` finds: for the checks a
    provider makes of the file after it loaded (gce's labels, image, GPUs
    and network)."""
    try:
        yield
    except ConfigError as exc:
        raise ConfigError(f"{config.source}: {exc}", hint=exc.hint) from None


def _cluster_model(data: dict[Any, Any] | None) -> type[ClusterConfig]:
    """ClusterConfig, plus a key for the own section of each provider the
    file uses (``NodeProvider.config_section``, under the provider's name):
    the provider it names and any other whose key it has (a gce file's
    ``gce:`` stays checked when it switches to provider ssh). Only those
    providers are imported: a local cluster's file loads no cloud's code.
    ``data`` None: every registered provider's (for "did you mean")."""
    named = data.get("provider", "local") if data is not None else None
    used = [
        name
        for name in provider_names()
        if name not in ClusterConfig.model_fields
        and (data is None or name in data or name == named)
    ]
    sections = provider_sections(used)
    return _with_sections(tuple(sorted(sections.items()))) if sections else ClusterConfig


@functools.cache
def _with_sections(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[ClusterConfig]:
    # Left out of the file, a section is its defaults (every field of a
    # section has one), as ClusterConfig's own sections are.
    fields: dict[str, Any] = {name: (model, model()) for name, model in sections}
    return create_model("ClusterConfig", __base__=ClusterConfig, **fields)


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,63}\Z")


def _lines(source: str, exc: ValidationError, model: type[BaseModel] | None = None) -> list[str]:
    """Every validation problem, each as 'file: key: problem; fix', unknown
    keys first; each line once."""
    errors = exc.errors()
    # A misspelt key also makes its correctly spelt twin "missing" in the
    # same section: report the misspelling, which is the actual mistake.
    misspelt = {tuple(e["loc"][:-1]) for e in errors if e["type"] == "extra_forbidden"}
    errors = [e for e in errors if e["type"] != "missing" or tuple(e["loc"][:-1]) not in misspelt]
    errors.sort(key=lambda e: e["type"] != "extra_forbidden")
    return list(dict.fromkeys(_one_line(source, err, model) for err in errors))


def _one_line(source: str, err: Any, model: type[BaseModel] | None = None) -> str:
    """One validation problem as 'file: key: problem; fix'."""
    loc = tuple(str(part) for part in err["loc"])
    ctx_error = (err.get("ctx") or {}).get("error")
    if isinstance(ctx_error, _KeyedError):
        return f"{source}: {'.'.join(ctx_error.loc)}: {ctx_error.message}"
    # Keys come from the file: a long or odd one is shown cut and quoted.
    key = ".".join(p if _PLAIN_KEY.match(p) else show(p, 40) for p in loc) or "(top level)"
    kind = err["type"]
    if kind == "extra_forbidden":
        # Near any provider's section name, not only those the file uses.
        every = _cluster_model(None) if len(loc) == 1 else model or ClusterConfig
        return f"{source}: {key}: unknown key{_did_you_mean(loc, every)}"
    if kind == "missing":
        return f"{source}: {key}: required key is missing"
    value = err.get("input")
    message = str(err["msg"])
    if kind == "value_error":
        message = message.removeprefix("Value error, ")
        return f"{source}: {key}: {message}"
    if kind == "literal_error":
        return f"{source}: {key}: {show(value)} is not allowed; {message.lower()}"
    return f"{source}: {key}: {show(value)}: {message}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation (Optional, dict values, Annotated)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _did_you_mean(loc: Sequence[str], model: type[BaseModel]) -> str:
    """'; did you mean 'zones'?' from the keys allowed where the unknown one is."""
    for part in loc[:-1]:
        field = model.model_fields.get(part)
        if field is None:
            continue  # a mapping key such as a node name under hosts
        inner = _model_in(field.annotation)
        if inner is None:
            return ""
        model = inner
    fields = [name for name in model.model_fields if name != "base_dir"]
    close = difflib.get_close_matches(loc[-1][:100], fields, n=1, cutoff=0.6)
    if close:
        return f"; did you mean '{close[0]}'?"
    return f"; known keys here: {', '.join(fields)}"
