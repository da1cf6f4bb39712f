"""infra.setup.nodes without nodes: the plan, the fingerprint, the commands'
text, and the parsers on recorded outputs (tests/recorded/)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from infra.config.loader import parse_config
from infra.errors import ConfigError
from infra.setup.commands import (
    apply_command,
    compare_command,
    install_command,
    probe_command,
    rsync_args,
)
from infra.setup.facts import parse_compare, parse_install, parse_listing, parse_probe, parse_rsync
from infra.setup.install import InstallPlan, gpu_requirements
from infra.setup.nodes import install_plan
from infra.setup.report import NodeSetup, SetupReport
from infra.setup.sync import in_sync, local_listing, local_manifest, manifest_text
from infra.setup.sync_items import CODE_PATHS, SyncItem, expand_vars, sync_items
from infra.transport.base import NodeLayout

RECORDED = Path(__file__).parent / "recorded"
LAYOUT = NodeLayout(
    root="tfcluster",
    code="tfcluster/code",
    python="tfcluster/venv/bin/python",
    runs="tfcluster/runs",
    logs="tfcluster/logs",
)


def recorded(name: str) -> str:
    return (RECORDED / name).read_text()


def _config(base: Path, **extra: object):
    data: dict[str, object] = {
        "name": "t",
        "provider": "ssh",
        "nodes": ["pc-1"],
        "roles": {"ps": [], "chief": "pc-1", "worker": []},
        "job": {"mode": "single"},
        "hosts": {"pc-1": "127.0.0.1:2201"},
    }
    data.update(extra)
    return parse_config(data, source="test", base_dir=base)


# -- facts ---------------------------------------------------------------------------


def test_parse_probe() -> None:
    fresh = parse_probe(recorded("probe-fresh.txt"))
    assert not fresh.installed and fresh.rsync and fresh.sha256sum
    assert fresh.tools == {
        "rsync": True,
        "sha256sum": True,
        "tar": True,
        "sudo": True,
        "apt-get": True,
    }
    assert parse_probe(recorded("probe-installed.txt")).installed
    # Noise from a login profile does not confuse it.
    assert parse_probe("Welcome!\n@tfcluster installed yes\n").installed


def test_parse_listing_and_quick_check(tmp_path: Path) -> None:
    listing = parse_listing(recorded("probe-synced.txt"), LAYOUT)
    assert listing == {
        "tfcluster/data/a.txt": (2, 1795384064993),
        "tfcluster/data/b.txt": (2, 1795384064993),
    }
    # A node that has none of the files prints an empty section: {} (not None).
    assert parse_listing(recorded("probe-installed.txt"), LAYOUT) == {}
    assert parse_listing(recorded("probe-fresh.txt"), LAYOUT) is None
    # What the local walk says once in sync (mtimes kept by rsync -a / tar).
    assert in_sync(listing, {"tfcluster/data/a.txt": (2, 1795384064994),
                             "tfcluster/data/b.txt": (2, 1795384064993)})  # fmt: skip
    assert not in_sync(listing, {"tfcluster/data/a.txt": (2, 1795384064993)})  # one gone locally
    assert not in_sync(listing, {**listing, "tfcluster/data/a.txt": (3, 1795384064993)})
    assert not in_sync(listing, {**listing, "tfcluster/data/a.txt": (2, 1795384065993)})
    assert not in_sync(None, {})
    (tmp_path / "d" / "__pycache__").mkdir(parents=True)
    (tmp_path / "d" / "x.py").write_text("x = 1\n")
    (tmp_path / "d" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    local = local_listing([SyncItem(tmp_path / "d", "tfcluster/d")])
    assert list(local) == ["tfcluster/d/x.py"] and local["tfcluster/d/x.py"][0] == 6


def test_parse_install() -> None:
    first = parse_install(recorded("install-first.txt"))
    assert first.done and first.venv_created and not first.apt
    assert first.commands_run == 1 and first.gpu is None
    gpu = parse_install(recorded("install-gpu-apt.txt"))
    assert gpu.done and gpu.apt and gpu.commands_run == 2 and gpu.gpu is False
    assert not parse_install(recorded("install-failed.txt")).done


def test_parse_rsync() -> None:
    first = parse_rsync(recorded("rsync-first.txt"))
    assert (first.files, first.bytes, first.deleted) == (2, 4, 0)
    changed = parse_rsync(recorded("rsync-changed.txt"))
    assert (changed.files, changed.bytes, changed.deleted) == (2, 10, 1)
    assert parse_rsync("") == parse_rsync(".d..t...... 4096 data/\n")


def test_parse_compare() -> None:
    got = parse_compare(recorded("compare.txt"), LAYOUT)
    assert got.changed == {"tfcluster/data/a.txt", "tfcluster/data/d.txt"}
    assert got.present == {
        "tfcluster/data/a.txt",
        "tfcluster/data/stale.txt",
        "tfcluster/data/c.txt",
    }


def test_parse_compare_absolute_root() -> None:
    layout = NodeLayout(
        "/opt/tf", "/opt/tf/code", "/opt/tf/venv/bin/python", "/opt/tf/runs", "/opt/tf/logs"
    )
    got = parse_compare("@tfcluster section changed\nopt/tf/code/a.py\n", layout)
    assert got.changed == {"/opt/tf/code/a.py"}


# -- the plan ------------------------------------------------------------------------


def test_gpu_swap_keeps_the_version() -> None:
    text = "# pins\ntensorflow-cpu==2.21.0\nkeras==3.15.1\n"
    assert gpu_requirements(text) == "# pins\ntensorflow[and-cuda]==2.21.0\nkeras==3.15.1\n"


def test_install_plan_and_fingerprint(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "six-1.17.0-py2.py3-none-any.whl").write_bytes(b"x" * 10)
    plan = install_plan(_config(tmp_path, setup={"wheelhouse": "wheels"}))
    assert plan.wheels == (("six-1.17.0-py2.py3-none-any.whl", 10),)
    assert "tensorflow-cpu==" in plan.requirements and not plan.gpu
    assert (
        plan.fingerprint
        == install_plan(_config(tmp_path, setup={"wheelhouse": "wheels"})).fingerprint
    )
    # Each input moves the fingerprint.
    base = plan.fingerprint
    variants = [
        InstallPlan(plan.requirements + "x==1\n", plan.python, plan.wheels, (), False),
        InstallPlan(plan.requirements, "python3.11", plan.wheels, (), False),
        InstallPlan(plan.requirements, plan.python, None, (), False),
        InstallPlan(plan.requirements, plan.python, plan.wheels, ("true",), False),
        InstallPlan(plan.requirements, plan.python, plan.wheels, (), True),
    ]
    assert len({base, *(v.fingerprint for v in variants)}) == 6
    (wheels / "numpy-2.4.6-cp311-cp311-manylinux_2_27_x86_64.whl").write_bytes(b"y")
    assert install_plan(_config(tmp_path, setup={"wheelhouse": "wheels"})).fingerprint != base


def test_gpu_only_with_an_accelerator_on_gce(tmp_path: Path) -> None:
    gce = _config(
        tmp_path,
        provider="gce",
        hosts={},
        gce={"accelerator": {"type": "nvidia-tesla-t4"}},
    )
    plan = install_plan(gce)
    assert plan.gpu and "tensorflow[and-cuda]==" in plan.requirements
    assert "gpu yes" in install_command(LAYOUT, plan, None)


def test_wheelhouse_must_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"setup.wheelhouse: .* is not a folder"):
        install_plan(_config(tmp_path, setup={"wheelhouse": "missing"}))


def test_marker_cli_matches_the_plan(tmp_path: Path) -> None:
    """The node image's build writes the marker with `python -m
    tfcluster_cli.compose marker`; a node set up by `up` must carry the same one. A wheelhouse of
    its own: the test runs on a fresh clone too (no docker/build-wheelhouse.sh)."""
    repo = Path(__file__).resolve().parents[1]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "numpy-2.0.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"not really a wheel")
    config = tmp_path / "compose.yaml"
    text = (repo / "examples" / "compose.yaml").read_text()
    assert "wheelhouse: ../.cache/wheelhouse" in text
    text = text.replace("wheelhouse: ../.cache/wheelhouse", f"wheelhouse: {wheels}")
    config.write_text(text)
    out = subprocess.run(
        [sys.executable, "-m", "tfcluster_cli.compose", "marker", "--config", str(config)],
        capture_output=True, text=True, check=True, cwd=repo,
    ).stdout.strip()  # fmt: skip
    from infra.config.loader import load_config

    plan = install_plan(load_config(config))
    assert plan.wheels == (("numpy-2.0.0-cp311-cp311-linux_x86_64.whl", 18),)
    assert out == plan.fingerprint and len(out) >= 16


# -- sync items --------------------------------------------------------------------


def test_sync_items(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "mnist").mkdir()
    monkeypatch.setenv("DATA", str(tmp_path / "mnist"))
    items = sync_items(_config(tmp_path, setup={"sync": ["$DATA"]}), LAYOUT)
    remotes = [i.remote for i in items]
    assert remotes[-1] == "tfcluster/mnist"
    assert "tfcluster/code/trainer" in remotes
    assert all(r.startswith("tfcluster/code/") for r in remotes[:-1])
    assert len(items) - 1 <= len(CODE_PATHS)


def test_sync_rejects_missing_reserved_and_duplicate(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        sync_items(_config(tmp_path, setup={"sync": ["nope"]}), LAYOUT)
    (tmp_path / "venv").mkdir()
    with pytest.raises(ConfigError, match="uses itself"):
        sync_items(_config(tmp_path, setup={"sync": ["venv"]}), LAYOUT)
    (tmp_path / "a" / "data").mkdir(parents=True)
    (tmp_path / "b" / "data").mkdir(parents=True)
    with pytest.raises(ConfigError, match="both land on"):
        sync_items(_config(tmp_path, setup={"sync": ["a/data", "b/data"]}), LAYOUT)


def test_expand_vars(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("X", "/data")
    monkeypatch.delenv("UNSET_X", raising=False)
    assert expand_vars("$X/mnist", "k") == "/data/mnist"
    assert expand_vars("${X}", "k") == "/data"
    assert expand_vars("${UNSET_X:-../mnist}", "k") == "../mnist"
    with pytest.raises(ConfigError, match=r"setup.sync: .*\$UNSET_X, which is not set"):
        expand_vars("$UNSET_X", "setup.sync")


def test_manifest_and_commands(tmp_path: Path) -> None:
    (tmp_path / "d" / "__pycache__").mkdir(parents=True)
    (tmp_path / "d" / "a.txt").write_text("a\n")
    (tmp_path / "d" / "__pycache__" / "a.pyc").write_text("x")
    manifest = local_manifest([SyncItem(tmp_path / "d", "tfcluster/d")])
    assert list(manifest) == ["tfcluster/d/a.txt"]
    assert manifest_text(manifest) == (
        "87428fc522803d31065e7bce3cf03fe475096631e5e07bbd7a0fde60c4cf25c7  tfcluster/d/a.txt\n"
    )
    compare = compare_command(LAYOUT, "tfcluster/.m", [SyncItem(tmp_path / "d", "tfcluster/d")])
    assert "sha256sum -c --quiet" in compare and "-name __pycache__ -prune" in compare
    applied = apply_command(LAYOUT, "tfcluster/.a.tgz", "tfcluster/.stale")
    assert 'tar -xzf "$H"/tfcluster/.a.tgz -C "$H"' in applied and "xargs -0 -r rm -f" in applied


def test_commands_are_valid_bash(tmp_path: Path) -> None:
    plan = InstallPlan("six==1.17.0\n", "python3", None, ("echo 'hi there'",), True)
    for script in (
        probe_command(LAYOUT, plan.fingerprint),
        install_command(LAYOUT, plan, "tfcluster/wheelhouse"),
        compare_command(LAYOUT, "tfcluster/.m", [SyncItem(tmp_path, "tfcluster/x")]),
        apply_command(LAYOUT, "tfcluster/.a", "tfcluster/.s"),
    ):
        subprocess.run(["bash", "-n", "-c", script], check=True)


def test_report_lines() -> None:
    report = SetupReport(
        {
            "pc-1": NodeSetup("pc-1", install="installed", install_seconds=52.4, files=12,
                              bytes=34_567, method="rsync"),
            "pc-2": NodeSetup("pc-2", install="already installed"),
            "pc-3": NodeSetup("pc-3", install="failed", error="pc-3: install failed: boom"),
        }
    )  # fmt: skip
    assert report.lines() == [
        "pc-1: installed (52 s), synced 12 files (34.6 kB) via rsync",
        "pc-2: already installed, code up to date",
        "pc-3: FAILED: pc-3: install failed: boom",
    ]
    assert report.changed and list(report.failed) == ["pc-3"]
    assert not SetupReport({"pc-2": NodeSetup("pc-2", install="already installed")}).changed


def _run_install(tmp_path: Path, plan: InstallPlan) -> subprocess.CompletedProcess[str]:
    """The install script in a real bash, against a stand-in venv whose
    python answers 0 to everything (so no venv or pip is made)."""
    root = tmp_path / "node"
    python = root / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 0\n")
    python.chmod(0o755)
    layout = NodeLayout(
        root=str(root),
        code=f"{root}/code",
        python=str(python),
        runs=f"{root}/runs",
        logs=f"{root}/logs",
    )
    script = install_command(layout, plan, None)
    return subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "tail",
    [
        "TFCLUSTER_REQUIREMENTS\ntouch {canary}\n",  # the old heredoc's delimiter
        "'\"$(touch {canary})\"`touch {canary}`\n",  # quotes and substitutions
    ],
)
def test_requirements_text_stays_data(tmp_path: Path, tail: str) -> None:
    canary = tmp_path / "canary"
    text = "numpy==2.0\n" + tail.format(canary=canary)
    plan = InstallPlan(requirements=text, python="sh", wheels=None, commands=(), gpu=False)
    done = _run_install(tmp_path, plan)
    assert not canary.exists()
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "node" / "requirements.txt").read_text() == text
    assert parse_install(done.stdout).done


def test_tf_keras_goes_in_after_the_requirements_without_dependencies(tmp_path: Path) -> None:
    """The default plan's tf-keras, pinned to the TensorFlow it pins, is
    installed by a second pip call with --no-deps (its metadata asks for
    the `tensorflow` wheel: 600 MB beside tensorflow-cpu's same module)."""
    plan = install_plan(parse_config({"name": "c"}, source="c.yaml"))
    tf = plan.tensorflow
    assert tf is not None and f"tf-keras=={tf}\n" in plan.no_deps
    assert "tf-keras" not in plan.requirements and "tf_keras==" + tf in plan.constraints
    root = tmp_path / "node"
    calls = tmp_path / "pip-calls"
    python = root / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexit 0\n')
    python.chmod(0o755)
    layout = NodeLayout(root=str(root), code=f"{root}/code", python=str(python),
                        runs=f"{root}/runs", logs=f"{root}/logs")  # fmt: skip
    done = subprocess.run(["bash", "-c", install_command(layout, plan, None)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    installs = [c for c in calls.read_text().splitlines() if " install " in c]
    assert len(installs) == 2, installs
    assert "--no-deps" not in installs[0] and f"-r {root}/requirements.txt" in installs[0]
    assert "--no-deps" in installs[1] and f"-r {root}/requirements-no-deps.txt" in installs[1]
    assert (root / "requirements-no-deps.txt").read_text() == plan.no_deps.rstrip("\n") + "\n"
    # A user's own requirements get none of it.
    own = tmp_path / "reqs.txt"
    own.write_text("numpy\n")
    mine = parse_config({"name": "c", "setup": {"requirements": str(own)}}, source="c.yaml")
    assert install_plan(mine).no_deps == ""


def test_hostile_setup_python_is_not_run(tmp_path: Path) -> None:
    canary = tmp_path / "canary"
    python = f"python3'; touch {canary}; '"
    plan = InstallPlan(requirements="numpy\n", python=python, wheels=None, commands=(), gpu=False)
    done = _run_install(tmp_path, plan)
    assert done.returncode == 20
    assert not canary.exists()
    assert f"no {python} on this node (setup.python)" in done.stderr


# -- rsync_args: the upload's sources are paths, never options --------------------


@pytest.mark.parametrize("contents", [False, True])
def test_rsync_args_end_the_options_before_the_sources(contents: bool) -> None:
    sources = [Path("-e"), Path("--foo")][: 1 if contents else 2]
    args = rsync_args(sources, "", contents=contents)
    cut = args.index("--")
    assert all(a.startswith("-") for a in args[:cut])
    assert args[cut + 1 :] == (["-e/"] if contents else ["-e", "--foo"])


@pytest.mark.skipif(shutil.which("rsync") is None, reason="needs a local rsync")
@pytest.mark.parametrize("name", ["-e", "--foo", "--delete-after"])
@pytest.mark.parametrize("contents", [False, True])
def test_a_source_named_like_an_option_is_copied(tmp_path: Path, name: str, contents: bool) -> None:
    """The real rsync, local to local, from the folder of the source (a
    relative path): it was read as an option (``-e dest/``: the remote
    shell; ``--foo``: unknown) and nothing was copied."""
    (tmp_path / name / "sub").mkdir(parents=True)
    (tmp_path / name / "sub" / "a.txt").write_text("a\n")
    dest = tmp_path / "dest"
    dest.mkdir()
    argv = ["rsync", *rsync_args([Path(name)], "", contents=contents), f"{dest}/"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    copied = dest if contents else dest / name
    assert (copied / "sub" / "a.txt").read_text() == "a\n"


def test_node_numbers_python_cannot_read_are_skipped() -> None:
    """A node's "digits" that str.isdigit() takes and int() refuses ("²"),
    and an mtime of 1e400 (float: inf, int(): OverflowError), once made
    `up` a bug exit; the line is skipped as any malformed one."""
    probe = recorded("probe-synced.txt").replace(
        "2 1795384064.9936786960 tfcluster/data/b.txt",
        "² 1 tfcluster/data/c.txt\n2 1e400 tfcluster/data/d.txt\n"
        "2 1795384064.9936786960 tfcluster/data/b.txt",
    )
    assert set(parse_listing(probe, LAYOUT) or {}) == {
        "tfcluster/data/a.txt", "tfcluster/data/b.txt",
    }  # fmt: skip
    assert parse_install("@tfcluster command ²\n@tfcluster command 2\n").commands_run == 2
    assert parse_rsync(">f+++++++++ ³ big.bin\n>f+++++++++ 5 a.txt\n").files == 1
