"""A sweep value in shell code (infra/sweeps/shell.py): in a POSIX shell's
script it arrives as data (run here with real shells and a hostile value);
in shell code tfcluster cannot quote for it is refused, one line, before
anything runs. Each form below once ran `--param x='0.1; touch pwned'`."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.errors import ConfigError
from infra.sweeps.spec import command_spec, parse_params, substitute

HOSTILE = "0.1; touch pwned; $(touch pwned2) `touch pwned3` \"; touch pwned4; \""


def run_in(folder: Path, words: tuple[str, ...], path: Path | None = None) -> str:
    """Run ``words`` in ``folder`` with the trial's variable set, as a trial
    would be; its stdout. Nothing of the value may have run."""
    env = {**os.environ, "X": HOSTILE}
    if path is not None:
        env["PATH"] = f"{path}:{env['PATH']}"
    done = subprocess.run(
        words, cwd=folder, capture_output=True, text=True, env=env, check=False, timeout=30
    )
    assert not list(folder.glob("pwned*")), (words, done.stdout, done.stderr)
    return done.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "--rcfile", "RC", "-c", "echo {x}"],  # a long option with its file
        ["bash", "--norc", "--noprofile", "-lc", "echo {x}"],
        ["bash", "-O", "extglob", "-c", "echo {x}"],
        ["sh", "-e", "-o", "nounset", "-c", 'echo "got {x}"'],
        ["ash", "-c", "echo {x}"],  # ash and mksh: POSIX shells (dash plays them here)
        ["mksh", "-e", "-c", "echo {x}"],
        ["/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "bash", "-c", "echo {x}"],
    ],
)
def test_a_value_in_a_posix_script_arrives_as_data(argv: list[str], tmp_path: Path) -> None:
    shims = tmp_path / "bin"
    shims.mkdir()
    dash = shutil.which("dash") or shutil.which("sh")
    assert dash is not None
    for name in ("ash", "mksh"):
        (shims / name).symlink_to(dash)
    (tmp_path / "RC").write_text("touch pwned-rc\n")
    words = substitute(argv, {"x": HOSTILE})
    if "-i" in argv:  # env -i: the value as the trial passes it, explicitly
        words = (*words[:3], f"X={HOSTILE}", *words[3:])
    out = run_in(tmp_path, words, shims)
    assert "touch pwned;" in out, (words, out)  # the value, printed as text


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (["env", "-S", 'sh -c "echo {x}"'], "run by env"),
        (["env", "--split-string=sh -c 'echo {x}'"], "run by env"),
        (["flock", "/tmp/lock", "-c", "echo {x}"], "run by flock"),
        (["flock", "-x", "/tmp/lock", "--command", "echo {x}"], "run by flock"),
        (["fish", "-c", "echo {x}"], "run by fish"),
        (["tcsh", "-c", "echo {x}"], "run by tcsh"),
        (["ssh", "host", "echo {x}"], "run by ssh"),
        (["su", "-c", "echo {x}", "me"], "run by su"),
        (["mksh", "-T", "-", "-c", "echo {x}"], "mksh with an option"),  # -T takes a word
        (["bash", "--debugger", "-c", "echo {x}"], "bash with an option"),
        (["zsh", "--emulate", "sh", "-c", "echo {x}"], "zsh with an option"),
        (["sh", "-c", "bash -c 'echo {x}'"], "a bash inside the script"),
        (["sh", "-c", 'bash -c "echo {x}"'], "a bash inside the script"),
        (["bash", "-c", 'eval "echo {x}"'], "the script's eval"),
        (["bash", "-c", 'trap "echo {x}" EXIT'], "the script's trap"),
        (["bash", "-c", "echo $(( {x} + 1 ))"], "the script's ((...))"),
        (["bash", "-c", "[[ {x} -gt 1 ]] && echo big"], "the script's [[...]]"),
        (["sh", "-c", "env -S 'sh -c \"echo {x}\"'"], "a env inside the script"),
    ],
)
def test_a_value_in_shell_code_it_cannot_quote_for_is_refused(
    argv: list[str], why: str, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"^COMMAND: \{x\} is in shell code") as info:
        command_spec(argv, parse_params(["x=1"]))
    assert why in str(info.value) and "$X" in str(info.value)
    assert len(str(info.value).splitlines()) == 1


@pytest.mark.parametrize(
    ("script", "got"),
    [
        ("python3 - <<EOF\nprint(repr({x}))\nEOF", "0.5\n"),  # Python code, as typed
        ("cat <<-EOF\n\tlr={x} done\n\tEOF\necho {x}", "lr=0.5 done\n0.5\n"),
        ('cat <<A; cat <<"B"\n{x}\nA\nno value here\nB', "0.5\nno value here\n"),
        ('cat <<<{x}; cat <<< "a {x}"', "0.5\na 0.5\n"),
    ],
)
def test_a_value_in_a_here_document_arrives_as_it_is(script: str, got: str, tmp_path: Path) -> None:
    """In a here-document's body quotes are text: '"${X}"' there gave the
    program the quotes too (`lr = "0.5"`, a str for Python where 0.5 was
    meant). The value arrives as it is, still never run by the shell."""
    words = substitute(["bash", "-c", script], {"x": "0.5"})
    env = {**os.environ, "X": "0.5"}
    done = subprocess.run(words, cwd=tmp_path, capture_output=True, text=True, env=env, check=True)
    assert done.stdout == got, words
    run_in(tmp_path, substitute(["bash", "-c", script], {"x": HOSTILE}))


def test_a_value_in_a_here_document_that_expands_nothing_is_refused() -> None:
    """Under a quoted delimiter nothing expands: the program got the text
    "${X}" instead of the value, silently."""
    with pytest.raises(ConfigError, match=r"here-document with a quoted delimiter \(<<'EOF'\)"):
        command_spec(["bash", "-c", "python3 - <<'EOF'\nlr = {x}\nEOF"], parse_params(["x=1"]))


# Computed, not only expanded: bash evaluates arithmetic in a value, and
# `a[$(cmd)]` there runs cmd, quotes or not.
ARITHMETIC = "a[$(touch pwned-arith)]"


@pytest.mark.parametrize(
    "script",
    [
        'a=(1 2 3); echo "${a[{x}]}"',  # an array element by index
        "a[{x}]=1",
        's=abcdef; echo "${s:{x}}"',  # a substring's offset
        "f() { :; }; s=ab; echo ${s:-x}${s:{x}:1}",
        "echo $[{x} + 1]",
        "declare -i n; n={x}; echo $n",
        "typeset -ri n={x}",
    ],
)
def test_a_value_where_the_script_computes_is_refused(script: str, tmp_path: Path) -> None:
    """Each of these, given "${X}" for the placeholder, ran the value's
    command substitution (checked here with real bash first)."""
    pasted = script.replace("{x}", '"${X}"')
    env = {**os.environ, "X": ARITHMETIC}
    subprocess.run(["bash", "-c", pasted], cwd=tmp_path, env=env, capture_output=True, check=False)
    assert (tmp_path / "pwned-arith").exists(), pasted  # the form is a real one
    with pytest.raises(ConfigError, match=r"^COMMAND: \{x\} is in shell code run by the script's"):
        command_spec(["bash", "-c", script], parse_params(["x=1"]))


@pytest.mark.parametrize("name", ["ksh93", "rbash", "zsh-5.9", "bash5.2", "dash.static"])
def test_a_shell_by_another_name_gets_no_value_as_code(name: str, tmp_path: Path) -> None:
    """A version in its name (ksh93, zsh-5.9), a static build or a
    restricted shell (rbash) is that shell: `ksh93 -c 'echo {x}'` ran the
    value."""
    shims = tmp_path / "bin"
    shims.mkdir()
    real = shutil.which("bash")
    assert real is not None
    (shims / name).symlink_to(real)
    words = substitute([name, "-c", "echo {x}"], {"x": HOSTILE})
    assert "touch pwned;" in run_in(tmp_path, words, shims)
    with pytest.raises(ConfigError, match="run by rsh"):
        command_spec(["rsh", "host", "echo {x}"], parse_params(["x=1"]))


@pytest.mark.parametrize(
    "argv",
    [
        ["flock", "/tmp/lock", "python", "fit.py", "--lr", "{x}"],  # flock runs argv
        ["env", "-i", "python", "fit.py", "{x}"],
        ["sudo", "-u", "me", "python", "fit.py", "{x}"],
        ["bash", "-c", 'python fit.py --lr "$1"', "_", "{x}"],  # a script's argument
        ["bash", "fit.sh", "{x}"],  # a script file: its arguments are data
        ["bash", "-c", "cd out && env A=1 python fit.py --lr {x}"],
        ["bash", "-c", 'f() { :; }; [ {x} -gt 0 ] && local -r v={x} && echo "${HOME}/{x}"'],
        ["./finish.sh", "{x}"],  # a program whose name ends as a shell's does
    ],
)
def test_argv_and_positional_arguments_still_take_values(argv: list[str]) -> None:
    spec = command_spec(argv, parse_params(["x=0.1"]))
    assert "{x}" not in " ".join(spec.command({"x": "0.1"}))


def test_the_sweep_command_refuses_before_anything_runs(tmp_path: Path) -> None:
    (tmp_path / "one.yaml").write_text(
        "name: one\nprovider: local\nnodes: [pc-1]\nroles: {chief: pc-1, worker: [], ps: []}\njob: {mode: single}\n"
    )
    result = CliRunner().invoke(
        cli,
        ["--config", str(tmp_path / "one.yaml"), "sweep", "--dest", str(tmp_path / "out"),
         "--param", f"x={HOSTILE.replace(',', ' ')}", "--", "env", "-S", 'sh -c "echo {x}"'],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "{x} is in shell code run by env" in result.output
    assert not list(tmp_path.rglob("pwned*")) and not (tmp_path / "out").exists()
