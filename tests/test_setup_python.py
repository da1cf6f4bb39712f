"""`setup.python` is the interpreter that makes the node's venv: the
install script, run for real in a folder here, creates the venv with it
(a wrapper around this Python that notes how it is called) and no other."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from infra.config.loader import parse_config
from infra.setup.commands import MARKER, install_command
from infra.setup.facts import parse_install
from infra.setup.nodes import install_plan
from infra.transport.base import NodeLayout


def test_the_venv_is_made_by_setup_python(tmp_path: Path) -> None:
    calls = tmp_path / "calls"
    wrapper = tmp_path / "bin" / "python-of-choice"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    config = parse_config(
        {"name": "x", "setup": {"python": str(wrapper)}}, source="c.yaml"
    )
    plan = install_plan(config)
    assert plan.python == str(wrapper)
    # pip itself as the requirement: already in the new venv, so nothing is
    # downloaded (the machine may be offline).
    plan = dataclasses.replace(plan, requirements="pip\n")
    root = tmp_path / "node"
    layout = NodeLayout(
        root=str(root), code=f"{root}/code", python=f"{root}/venv/bin/python",
        runs=f"{root}/runs", logs=f"{root}/logs",
    )  # fmt: skip
    done = subprocess.run(
        ["bash", "-c", install_command(layout, plan, None)],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    facts = parse_install(done.stdout)
    assert facts.done and facts.venv_created
    assert (root / "venv" / "pyvenv.cfg").is_file()
    made = [line for line in calls.read_text().splitlines() if line.startswith("-m venv")]
    assert made and made[0].endswith(f"{root}/venv"), calls.read_text()
    assert (root / "venv" / MARKER).read_text().strip() == plan.fingerprint
