"""Benchmark of ``infra.setup.nodes`` on real sshd nodes (containers of the bare
node image): does setup scale out, and is a no-change sync quick?

    .venv/bin/python bench/setup.py [--full] [--json-only]

* install + sync on 4 fresh nodes vs on 1 fresh node: the nodes are set up
  in parallel, so the ratio should stay near 1 (target <= 1.3x). Each node
  container gets the same CPU share (``--node-cpus``, default this machine's
  CPUs / 4) whether it runs alone or with three others: four VMs each have
  their own CPUs, and without the cap the single node would borrow the
  cores that four nodes must share here, which measures this machine, not
  setup. The default share is this machine's CPUs / 5: the fifth left over
  stands for the operator's own machine, where ``deploy.py`` and its ssh
  and rsync clients run (with CPUs / 4, four busy nodes took every core and
  the orchestrator's work came out of theirs, which no real cluster does).
  The install is a small wheelhouse of pure-Python wheels;
  ``--full`` installs the real trainer requirements (TensorFlow) instead.
* re-sync with nothing changed, on 4 nodes, with a fresh transport (as
  ``deploy.py train`` does it: new connections included): target <= 1 s;
  with rsync and with the manifest fallback.

Prints a table, then one JSON object. Needs docker (and builds the bare
node image if missing); removes its containers however it ends.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from infra.config.loader import ClusterConfig, parse_config  # noqa: E402
from infra.setup.nodes import setup_nodes, sync_nodes  # noqa: E402
from infra.state.folder import ClusterState  # noqa: E402
from infra.state.keys import ensure_key_pair  # noqa: E402
from infra.transport.ssh import SshTarget, SshTransport  # noqa: E402

IMAGE = os.environ.get("TFCLUSTER_BENCH_IMAGE", "tfcluster/node-bare:local")
LABEL = f"tfcluster-bench={os.getpid()}"
LIGHT_WHEELS = ("six", "termcolor", "absl_py", "wheel", "packaging")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _docker(*args: str) -> str:
    return subprocess.run(
        ["docker", *args], check=True, capture_output=True, text=True
    ).stdout.strip()


@contextmanager
def nodes(count: int, public_key: str, cpus: float) -> Iterator[list[SshTarget]]:
    """``count`` fresh node containers of ``cpus`` CPUs each; removed on the
    way out."""
    names: list[str] = []
    targets = []
    try:
        for i in range(1, count + 1):
            port = _free_port()
            name = f"tfcluster-bench-{os.getpid()}-{secrets.token_hex(3)}"
            names.append(name)
            _docker(
                "run", "-d", "--name", name, "--label", LABEL, "--cpus", f"{cpus:g}",
                "-p", f"127.0.0.1:{port}:22", "-e", f"AUTHORIZED_KEYS={public_key}", IMAGE,
            )  # fmt: skip
            targets.append(SshTarget(f"pc-{i}", "127.0.0.1", port))
        yield targets
    finally:
        if names:
            subprocess.run(["docker", "rm", "-f", *names], capture_output=True)


def config_for(
    targets: list[SshTarget], work: Path, key: Path, full: bool, mnist: Path | None
) -> ClusterConfig:
    names = [t.node for t in targets]
    setup: dict[str, Any] = {"wheelhouse": str(REPO / ".cache" / "wheelhouse")}
    if not full:
        setup = {"wheelhouse": str(work / "wheels"), "requirements": str(work / "requirements.txt")}
    if mnist is not None:
        setup["sync"] = [str(mnist)]
    return parse_config(
        {
            "name": "bench",
            "provider": "ssh",
            "nodes": names,
            "roles": {"ps": [], "chief": names[0], "worker": names[1:]},
            "job": {"mode": "sync" if len(names) > 1 else "single"},
            "hosts": {t.node: {"address": t.host, "port": t.port} for t in targets},
            "ssh": {"key_file": str(key)},
            "setup": setup,
        },
        source="bench",
        base_dir=work,
    )


def resync_times(
    targets: list[SshTarget], work: Path, key: Path, state: ClusterState, args: Any
) -> dict[str, float]:
    """Median time of a re-sync of 4 nodes, each with a fresh transport (as
    ``deploy.py train`` syncs): nothing changed; one data file changed (by
    rsync, and by the hash manifest where rsync is missing)."""
    data = work / "data"
    data.mkdir(exist_ok=True)
    changed = data / "changed.txt"
    changed.write_text("start\n")
    base = config_for(targets, work, key, args.full, _mnist())
    config = base.model_copy(
        update={"setup": base.setup.model_copy(update={"sync": [*base.setup.sync, str(data)]})}
    )
    with SshTransport(targets, config=config, state=state, key_file=key) as t:
        sync_nodes(t, config)
    out: dict[str, float] = {}
    for case in ("nochange", "rsync", "manifest"):
        times = []
        for i in range(args.repeat):
            if case != "nochange":
                changed.write_text(f"{case} {i}" + "." * i + "\n")
            with SshTransport(targets, config=config, state=state, key_file=key) as t:
                if case == "manifest":
                    t.has_local_rsync = lambda: False  # type: ignore[method-assign]
                seconds, report = timed(partial(sync_nodes, t, config))
            assert report.files == (0 if case == "nochange" else len(targets)), report.lines()
            times.append(seconds)
        out[f"resync_{case}_4_nodes_s"] = round(statistics.median(times), 3)
    return out


def _mnist() -> Path | None:
    env = os.environ.get("MNIST_DIR")
    path = Path(env) if env else REPO.parent / "shared" / "datasets" / "mnist"
    return path if path.is_dir() else None


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def docker_answers() -> bool:
    return (
        shutil.which("docker") is not None
        and subprocess.run(["docker", "info"], capture_output=True).returncode == 0
    )


def build_images() -> None:
    """The bare node image and the wheelhouse, where missing or stale."""
    env = dict(os.environ, NODE_IMAGE=IMAGE, BAKE_VENV="0", PYTHON=sys.executable)
    subprocess.run(["bash", str(REPO / "docker" / "build-node-image.sh")], env=env, check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run(["bash", str(REPO / "docker" / "build-wheelhouse.sh")], check=True,
                   capture_output=True, cwd=REPO)  # fmt: skip


def light_requirements(work: Path) -> None:
    """work/wheels and work/requirements.txt: the small pure-Python install."""
    (work / "wheels").mkdir()
    pins = []
    for name in LIGHT_WHEELS:
        for wheel in sorted((REPO / ".cache" / "wheelhouse").glob(f"{name}-*.whl")):
            shutil.copy(wheel, work / "wheels")
            pins.append(f"{name.replace('_', '-')}=={wheel.name.split('-')[1]}")
    (work / "requirements.txt").write_text("\n".join(pins) + "\n")


def fresh_node_times(count: int, public: str, work: Path, key: Path, args: Any) -> dict[str, Any]:
    """Setup (install + sync), then sync alone, each on ``count`` fresh
    nodes; on 4 nodes also the re-syncs."""
    mnist = _mnist()
    results: dict[str, Any] = {}
    with nodes(count, public, args.node_cpus) as targets:
        config = config_for(targets, work, key, args.full, mnist)
        state = ClusterState("bench", home=work / f"home-{count}")
        with SshTransport(targets, config=config, state=state, key_file=key) as t:
            t.wait_ready(timeout=60)
            seconds, report = timed(partial(setup_nodes, t, config))
        results[f"setup_{count}_nodes_s"] = round(seconds, 2)
        results[f"setup_{count}_nodes_files"] = report.files
    # Sync alone on fresh nodes: the part of setup that is ours, not pip's CPU.
    with nodes(count, public, args.node_cpus) as targets:
        config = config_for(targets, work, key, args.full, mnist)
        state = ClusterState("bench", home=work / f"home-sync-{count}")
        with SshTransport(targets, config=config, state=state, key_file=key) as t:
            t.wait_ready(timeout=60)
            seconds, report = timed(partial(sync_nodes, t, config))
        results[f"sync_{count}_nodes_s"] = round(seconds, 2)
        if count == 4:
            results.update(resync_times(targets, work, key, state, args))
    return results


def print_table(results: dict[str, Any]) -> None:
    rows = [
        ("install + sync, 1 fresh node", f"{results['setup_1_nodes_s']:.2f} s", ""),
        ("install + sync, 4 fresh nodes", f"{results['setup_4_nodes_s']:.2f} s", ""),
        ("  ratio 4 / 1", f"{results['scale_4_vs_1']:.2f}x", "<= 1.3x"),
        ("sync only, 1 fresh node", f"{results['sync_1_nodes_s']:.2f} s", ""),
        ("sync only, 4 fresh nodes", f"{results['sync_4_nodes_s']:.2f} s", ""),
        ("  ratio 4 / 1", f"{results['sync_scale_4_vs_1']:.2f}x", "<= 1.3x"),
        ("re-sync, no change, 4 nodes",
         f"{results['resync_nochange_4_nodes_s']:.3f} s", "<= 1 s"),
        ("re-sync, 1 file changed, 4 nodes (rsync)",
         f"{results.get('resync_rsync_4_nodes_s', float('nan')):.3f} s", ""),
        ("re-sync, 1 file changed, 4 nodes (manifest)",
         f"{results.get('resync_manifest_4_nodes_s', float('nan')):.3f} s", ""),
    ]  # fmt: skip
    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  {'value':>10}  target")
    for name, value, target in rows:
        print(f"{name:<{width}}  {value:>10}  {target}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="install the real requirements")
    parser.add_argument("--json-only", action="store_true")
    parser.add_argument("--repeat", type=int, default=5, help="no-change re-syncs to time")
    parser.add_argument(
        "--node-cpus",
        type=float,
        default=max(0.25, (os.cpu_count() or 1) / 5),
        help="CPUs of each node container (default: this machine's CPUs / 5)",
    )
    args = parser.parse_args()
    if not docker_answers():
        print("bench/setup.py: docker does not answer; nothing measured", file=sys.stderr)
        return 0
    build_images()

    results: dict[str, Any] = {
        "image": IMAGE, "full_install": args.full, "cpus": os.cpu_count(),
        "node_cpus": args.node_cpus,
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-") as tmp:
        work = Path(tmp)
        key = work / "id_ed25519"
        public = ensure_key_pair(key, "bench")
        light_requirements(work)
        for count in (1, 4):
            results.update(fresh_node_times(count, public, work, key, args))
    results["scale_4_vs_1"] = round(results["setup_4_nodes_s"] / results["setup_1_nodes_s"], 2)
    results["sync_scale_4_vs_1"] = round(results["sync_4_nodes_s"] / results["sync_1_nodes_s"], 2)
    results["targets"] = {"scale_4_vs_1": 1.3, "resync_nochange_s": 1.0}
    if not args.json_only:
        print_table(results)
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
