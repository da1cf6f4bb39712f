"""What a sweep runs: the grid of parameter values (``--param NAME=V1,V2``)
and the command of each of its points (``SweepSpec``).

A point's values reach the command three ways: in its ``{name}``
placeholders (in shell code as the trial's variable, or refused: see
``infra/sweeps/shell.py``), as
one environment variable per parameter, and for the built-in trainer as its
flags. Everything here is checked before a node is touched: a bad name, a
placeholder with no parameter, a flag the trainer does not have is one
ConfigError at once. infra/sweeps/run.py runs the trials.
"""

from __future__ import annotations

import itertools
import math
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from infra.config.loader import check_env, check_env_name
from infra.errors import ConfigError
from infra.sweeps.shell import PLACEHOLDER, in_script, refuse, shell_forms

# A parameter's name: a placeholder `{name}` and, upper-cased, a variable.
_PARAM_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}\Z")
# Trials of one sweep, at most (each is a row of sweep.json, rewritten as
# each trial starts and ends).
MAX_TRIALS = 10_000

Params = dict[str, tuple[str, ...]]


# -- the grid --------------------------------------------------------------------


def parse_params(pairs: Iterable[str], *, option: str = "--param") -> Params:
    """``NAME=V1,V2,...`` pairs -> {name: values}, in the order given."""
    params: Params = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        name = name.strip()
        if not sep or not _PARAM_NAME.match(name):
            raise ConfigError(
                f"{option} {pair[:60]!r}: write NAME=V1,V2,... with NAME of letters, digits and _"
            )
        values = tuple(v.strip() for v in text.split(","))
        if not text.strip() or not all(values):
            raise ConfigError(
                f"{option} {name}: no value (or an empty one); give values as {name}=V1,V2,..."
            )
        if name.lower() in (p.lower() for p in params):
            raise ConfigError(f"{option} {name}: given twice; put every value in one {option}")
        if (problem := check_env_name(name.upper())) is not None:
            raise ConfigError(f"{option} {name}: {problem}")
        params[name] = tuple(dict.fromkeys(values))  # a value once
    return params


def grid(params: Mapping[str, Sequence[str]], trials: int | None = None) -> list[dict[str, str]]:
    """Every combination of the values (the first parameter varies
    slowest), or the first ``trials`` of them; at most MAX_TRIALS (a grid
    of 10^8 points was built whole, --trials 3 or not: MemoryError)."""
    names = list(params)
    total = math.prod(len(params[n]) for n in names)
    count = total if trials is None else min(trials, total)
    if count > MAX_TRIALS:
        raise ConfigError(
            f"{total} combinations of the parameters: more than {MAX_TRIALS} trials; "
            f"give fewer values, or --trials N to run the first N"
        )
    combos = itertools.islice(itertools.product(*(params[n] for n in names)), count)
    return [dict(zip(names, combo, strict=True)) for combo in combos]


def placeholders(argv: Sequence[str]) -> list[str]:
    """The ``{name}`` placeholders of a command, in order, once each."""
    return list(dict.fromkeys(m.group(1) for word in argv for m in PLACEHOLDER.finditer(word)))


def check_placeholders(argv: Sequence[str], params: Mapping[str, Sequence[str]]) -> None:
    for name in placeholders(argv):
        if name not in params:
            raise ConfigError(
                f"COMMAND has the placeholder {{{name}}} and no --param {name}=...; "
                f"add --param {name}=V1,V2 or remove it"
            )


def substitute(argv: Sequence[str], values: Mapping[str, str]) -> tuple[str, ...]:
    """COMMAND with each ``{name}`` replaced by the trial's value. A command
    runs as its words, never through a shell, so a value lands in its word
    as it is. In shell code no value is ever put as text
    (``infra/sweeps/shell.py``): in the script of a POSIX shell (``bash -c
    SCRIPT``, ``sh -ec``, ``bash --rcfile F -lc``, ``env bash -x -c``...)
    the placeholder becomes a reference to the trial's variable
    (``"${NAME}"``, in double quotes ``${NAME}``), whose value the shell
    never reads as code, whatever quotes or ``$(...)`` the script puts it in
    (in a here-document's body, where quotes are text, ``${NAME}``). In
    single quotes or under ``<<'EOF'`` a variable is not expanded, and in shell
    code tfcluster cannot quote for (``fish -c``, ``env -S``, ``flock -c``,
    a nested ``bash -c``, ``eval``...) nothing is safe: refused
    (ConfigError)."""
    forms = shell_forms(argv)
    out = []
    for i, word in enumerate(argv):
        if i in forms.opaque and (used := [n for n in placeholders([word]) if n in values]):
            raise refuse(used[0], forms.opaque[i])
        if i in forms.scripts:
            out.append(in_script(word, values))
            continue

        def put(match: re.Match[str]) -> str:
            value = values.get(match.group(1))
            return match.group(0) if value is None else value

        out.append(PLACEHOLDER.sub(put, word))
    return tuple(out)


def param_env(values: Mapping[str, str]) -> dict[str, str]:
    """One variable per parameter, its name in upper case."""
    return {name.upper(): value for name, value in values.items()}


@dataclass(frozen=True)
class SweepSpec:
    """What every trial runs: ``argv`` with the trial's values put in its
    placeholders (``command``), or the built-in trainer with the values as
    its flags (``builtin``: ``learning_rate`` -> ``--learning-rate``)."""

    sweep_id: str
    argv: tuple[str, ...]
    params: Params
    points: tuple[dict[str, str], ...]
    builtin: bool = False
    env: tuple[tuple[str, str], ...] = ()
    label: str = ""

    def command(self, values: Mapping[str, str]) -> tuple[str, ...]:
        if self.builtin:
            flags = [
                word
                for name, value in values.items()
                for word in ("--" + name.replace("_", "-"), value)
            ]
            return (*self.argv, *flags)
        return substitute(self.argv, values)


def new_sweep_id() -> str:
    """``sweep-<UTC time>-<6 hex>``: two sweeps begun in the same second
    (two clusters, one --dest; or one sweep right after another) once got
    one id, so one folder, here and on the nodes: trials and sweep.json
    of both mixed."""
    from infra.spec.job import new_run_id

    return f"{new_run_id('sweep')}-{secrets.token_hex(3)}"


def command_spec(
    argv: Sequence[str],
    params: Params,
    *,
    trials: int | None = None,
    env: Mapping[str, str] | None = None,
) -> SweepSpec:
    """A sweep of the user's own command."""
    if not argv:
        raise ConfigError("no command to run: put it after --, e.g. -- python train.py")
    check_placeholders(argv, params)
    substitute(argv, dict.fromkeys(params, ""))  # a placeholder in '...': refused now
    for name, value in (env or {}).items():
        if (problem := check_env(name, value)) is not None:
            raise ConfigError(f"--env: {problem}")
    return SweepSpec(
        sweep_id=new_sweep_id(),
        argv=tuple(argv),
        params=params,
        points=tuple(grid(params, trials)),
        env=tuple(sorted((env or {}).items())),
        label=" ".join(argv),
    )


def trainer_spec(
    base_argv: Sequence[str], params: Params, *, trials: int | None = None
) -> SweepSpec:
    """A sweep of the built-in trainer (``base_argv``: ``python -m trainer``
    and the flags every trial shares). Each parameter must be one of the
    trainer's flags, and must not also be given as a fixed flag."""
    from trainer.flags import build_parser

    actions = {s: a for a in build_parser()._actions for s in a.option_strings if s[:2] == "--"}
    known = set(actions)
    for name in params:
        flag = "--" + name.replace("_", "-")
        if flag in known and actions[flag].nargs == 0:
            # `--mixed-precision 1` is no flag and its value; and removing
            # the fixed flag with "its value" took the next flag instead.
            raise ConfigError(
                f"--sweep {name}: {flag} is a switch (on or off), not a flag with a value; "
                "sweep the other flags, once with it and once without"
            )
        if flag not in known:
            choices = ", ".join(sorted(f[2:].replace("-", "_") for f in known - {"--help"}))
            raise ConfigError(
                f"--sweep {name}: not a flag of the built-in trainer; one of {choices}"
            )
        if flag in ("--mode", "--output-dir", "--resume"):
            raise ConfigError(f"--sweep {name}: every trial is one process of its own; not swept")
    argv = list(base_argv)
    for name in params:
        # cluster.yaml's value (or a fixed flag) gives way to the swept one.
        flag = "--" + name.replace("_", "-")
        while flag in argv:
            at = argv.index(flag)
            del argv[at : at + 2]
    return SweepSpec(
        sweep_id=new_sweep_id(),
        argv=tuple(argv),
        params=params,
        points=tuple(grid(params, trials)),
        builtin=True,
        label="built-in trainer",
    )
