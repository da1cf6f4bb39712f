"""`status` shows a node's GPUs: the nvidia-smi query (infra/node/probes.py)
run by real bash, its parser (infra/node/facts.py) on recorded output, and the
column of `deploy.py status` on the local provider.

No GPU here: where nvidia-smi must answer, a script of that name on PATH
prints what the real one prints (tests/recorded/gpu-*.txt) and checks that
it was asked the query the parser reads."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from deploy import cli
from infra.node import facts, probes
from infra.node.facts import Gpu
from tfcluster_cli.render import gpus_text as _gpus

RECORDED = Path(__file__).parent / "recorded"
QUERY = "--query-gpu=name,memory.total,utilization.gpu --format=csv,noheader,nounits"


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def test_h100_and_two_t4s_parse_from_recorded_output() -> None:
    h100 = facts.parse_gpus(recorded("gpu-h100.txt"))
    assert h100.gpus == (Gpu("NVIDIA H100 80GB HBM3", 81559, 0),) and h100.problem is None
    t4 = facts.parse_gpus(recorded("gpu-t4x2.txt"))
    assert t4.gpus == (Gpu("Tesla T4", 15360, 0), Gpu("Tesla T4", 15360, 93))


def test_no_nvidia_smi_and_a_driver_that_does_not_load_say_why() -> None:
    none = facts.parse_gpus(recorded("gpu-none.txt"))
    assert none.gpus == () and none.problem == "no nvidia-smi (no NVIDIA driver)"
    broken = facts.parse_gpus(recorded("gpu-no-driver.txt"))
    assert broken.gpus == ()
    assert broken.problem is not None
    assert broken.problem.startswith("nvidia-smi failed (exit 9): NVIDIA-SMI has failed")


def test_gpu_names_are_data() -> None:
    # A name with commas keeps them; terminal controls from a node are dropped.
    report = facts.parse_gpus("NVIDIA A100-SXM4-40GB, MIG 1g.5gb, [N/A], [N/A]\n")
    assert report.gpus == (Gpu("NVIDIA A100-SXM4-40GB, MIG 1g.5gb", None, None),)
    hostile = facts.parse_gpus("[red]x\x1b]0;owned\x07\x1b[2J, 1024, 5\n")
    assert hostile.gpus == (Gpu("[red]x", 1024, 5),)


def test_gpu_numbers_int_cannot_read_are_unknown() -> None:
    # A node's "digits" that str.isdigit() accepts and int() refuses
    # (superscripts, 5000 digits) once made `status` a bug exit.
    report = facts.parse_gpus("T4, ²³, ١٢\nT4, " + "9" * 5000 + ", 1\n")
    assert report.gpus == (Gpu("T4", None, None), Gpu("T4", None, 1))
    assert _gpus(report) == "2 x T4, busy ?, 1 %"


def fake_nvidia_smi(folder: Path, output: str, code: int = 0) -> Path:
    """An executable ``nvidia-smi`` that prints ``output`` when asked the
    query the parser reads, and fails loudly otherwise."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "out.txt").write_text(output)
    script = folder / "nvidia-smi"
    script.write_text(
        "#!/bin/bash\n"
        f'[ "$*" = {QUERY!r} ] || {{ echo "unexpected arguments: $*" >&2; exit 99; }}\n'
        f"cat {str(folder / 'out.txt')!r}\n"
        f"exit {code}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def run_query(path: str) -> str:
    result = subprocess.run(
        ["bash", "-c", probes.gpu_query()],
        env={"PATH": path, "HOME": os.environ.get("HOME", "/")},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,  # the query itself never fails: no GPU is an answer
    )
    return result.stdout


def test_query_under_bash_with_and_without_nvidia_smi(tmp_path: Path) -> None:
    system = "/usr/bin:/bin"
    assert facts.parse_gpus(run_query(system)).problem == "no nvidia-smi (no NVIDIA driver)"

    ok = fake_nvidia_smi(tmp_path / "ok", recorded("gpu-t4x2.txt"))
    assert len(facts.parse_gpus(run_query(f"{ok}:{system}")).gpus) == 2

    message = recorded("gpu-no-driver.txt").split("@")[0]
    broken = fake_nvidia_smi(tmp_path / "broken", message, code=9)
    out = run_query(f"{broken}:{system}")
    assert out == recorded("gpu-no-driver.txt")


def cli_run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    return result.exit_code, result.output


def test_status_shows_the_gpus_of_local_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert cli_run("up")[0] == 0
    try:
        # Not asked by default: local nodes declare no accelerator.
        nodes = json.loads(cli_run("status", "--json")[1])
        assert all(n["gpus"] is None for n in nodes)
        assert "gpus" not in cli_run("status")[1]

        fake = fake_nvidia_smi(tmp_path / "bin", recorded("gpu-h100.txt"))
        monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
        code, out = cli_run("status", "--gpus", "--json")
        assert code == 0
        for node in json.loads(out):
            assert node["gpus"] == {
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "utilization": 0}],
                "problem": None,
            }
        code, out = cli_run("status", "--gpus")
        # The cell wraps in the test's 80-character terminal; its text is below.
        assert code == 0 and "gpus" in out and "H100" in out
    finally:
        assert cli_run("down", "--yes")[0] == 0


def test_gpu_cells() -> None:
    assert _gpus(facts.parse_gpus(recorded("gpu-h100.txt"))) == (
        "1 x NVIDIA H100 80GB HBM3, 80 GiB, busy 0 %"
    )
    assert _gpus(facts.parse_gpus(recorded("gpu-t4x2.txt"))) == (
        "2 x Tesla T4, 15 GiB, busy 0 %, 93 %"
    )
    assert _gpus(facts.parse_gpus(recorded("gpu-none.txt"))) == "no nvidia-smi (no NVIDIA driver)"
    assert _gpus(None) == "-"
