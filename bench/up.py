"""Benchmark of the Compute Engine lifecycle: do up, stop, start and down
scale out? (Not a test: it prints what it measured.)

    .venv/bin/python bench/up.py [--create 3] [--stop 2] [--start 2] [--delete 2]
                                 [--repeat 2] [--json-only]

Runs ``deploy.py up --skip-setup``, ``stop``, ``start`` and ``down --yes``
in this process (click's CliRunner, the real google-cloud-compute client
over HTTP) against the fake Compute API of tests/fake_gce, run as a server
process of its own (``python -m tests.fake_gce``: a benchmark imports
nothing of tests/, and the client shares no interpreter with the server,
as with the real API), whose operations take fixed times like real ones: creating an instance
``--create`` seconds (two thirds PROVISIONING, one third STAGING),
stopping, starting and deleting their own. The provider's own settings are
its defaults (polling, retries), as a user gets them.

Each command is timed on a 1-node and on a 4-node cluster, each on a fresh
fake; ``--repeat`` runs of each size, interleaved, the median reported (the
client library is imported once before, as it is not part of any command).
The nodes are handled in parallel, so 4 nodes should take about as long as
1: target ratio <= 1.15x. Prints a table, then one JSON object.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from deploy import cli  # noqa: E402

TARGET = 1.15
PROJECT = "bench-project"
COMMANDS = (
    ("up", ["up", "--skip-setup"]),
    ("stop", ["stop"]),
    ("start", ["start"]),
    ("down", ["down", "--yes"]),
)


def cluster_yaml(path: Path, endpoint: str, count: int) -> Path:
    nodes = [f"pc-{i}" for i in range(1, count + 1)]
    if count == 1:
        # One node: the chief alone (single mode needs no ps or workers).
        roles: dict[str, Any] = {"ps": [], "chief": "pc-1", "worker": []}
        job = {"mode": "single"}
    else:
        roles = {"ps": "pc-1", "chief": "pc-1", "worker": nodes[1:]}
        job = {"mode": "async"}
    path.write_text(
        yaml.safe_dump(
            {
                "name": f"bench-{count}",
                "provider": "gce",
                "nodes": nodes,
                "roles": roles,
                "job": job,
                "gce": {
                    "project": PROJECT,
                    "zones": ["us-central1-a", "us-central1-b"],
                    "api_endpoint": endpoint,
                    "credentials": "anonymous",
                    "ssh_source_ranges": ["198.51.100.7/32"],
                },
            }
        )
    )
    return path


@contextmanager
def fake_gce(latency: dict[str, float]) -> Iterator[str]:
    """A fresh fake Compute API in a process of its own; its endpoint.
    Closing its standard input stops it."""
    flags = [f"--{state}={seconds}" for state, seconds in latency.items()]
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_gce", "--wait-max=30", *flags],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdin is not None and server.stdout is not None
    try:
        line = server.stdout.readline()
        if not line.startswith("endpoint "):
            raise SystemExit(f"bench/up.py: the fake Compute API did not start: {line!r}")
        yield line.split()[1]
    finally:
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def leftovers(endpoint: str) -> list[str]:
    """Instances and firewall rules (GCE's default-allow-* aside) that
    exist in the fake's project, as its API lists them."""
    base = f"{endpoint}/compute/v1/projects/{PROJECT}"

    def get(path: str) -> dict[str, Any]:
        with urllib.request.urlopen(base + path, timeout=30) as response:
            return dict(json.load(response))

    zones = get("/aggregated/instances").get("items", {}).values()
    names = [i["name"] for zone in zones for i in zone.get("instances", [])]
    rules = [f["name"] for f in get("/global/firewalls").get("items", [])]
    return names + [r for r in rules if not r.startswith("default-allow-")]


def measure(count: int, latency: dict[str, float], work: Path) -> dict[str, float]:
    """Seconds of each command on a fresh ``count``-node cluster."""
    times: dict[str, float] = {}
    runner = CliRunner()
    with fake_gce(latency) as endpoint:
        config = cluster_yaml(work / f"cluster-{count}.yaml", endpoint, count)
        for name, args in COMMANDS:
            started = time.monotonic()
            result = runner.invoke(cli, ["--config", str(config), *args])
            times[name] = time.monotonic() - started
            if result.exit_code != 0:
                raise SystemExit(f"bench/up.py: `{' '.join(args)}` failed:\n{result.output}")
        if left := leftovers(endpoint):
            raise SystemExit(f"bench/up.py: `down` left something behind: {', '.join(left)}")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create", type=float, default=3.0, help="seconds to create one VM")
    parser.add_argument("--stop", type=float, default=2.0, help="seconds to stop one VM")
    parser.add_argument("--start", type=float, default=2.0, help="seconds to start one VM")
    parser.add_argument("--delete", type=float, default=2.0, help="seconds to delete one VM")
    parser.add_argument("--repeat", type=int, default=2, help="runs of each size (median)")
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    # Loaded once per process, and lazily by the CLI (on the provider's
    # first API call): not part of any command's time.
    import google.cloud.compute_v1  # noqa: F401
    latency = {
        "provision": args.create * 2 / 3,
        "staging": args.create / 3,
        "start": args.start,
        "stop": args.stop,
        "delete": args.delete,
        "firewall": 0.5,
    }
    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-") as tmp:
        work = Path(tmp)
        # A state folder of its own: the bench never touches ~/.tfcluster.
        os.environ["TFCLUSTER_HOME"] = str(work / "home")
        logging.getLogger("tfcluster").setLevel(logging.WARNING)
        runs: dict[int, list[dict[str, float]]] = {1: [], 4: []}
        for _ in range(args.repeat):
            for count in (1, 4):  # interleaved: drift hits both sizes alike
                runs[count].append(measure(count, latency, work))
    one = {name: statistics.median(r[name] for r in runs[1]) for name, _ in COMMANDS}
    four = {name: statistics.median(r[name] for r in runs[4]) for name, _ in COMMANDS}
    results: dict[str, Any] = {
        "latency_s": {
            "create": args.create, "stop": args.stop, "start": args.start, "delete": args.delete,
        },
        "target_ratio": TARGET,
        "repeat": args.repeat,
    }
    for name, _ in COMMANDS:
        results[f"{name}_1_node_s"] = round(one[name], 2)
        results[f"{name}_4_nodes_s"] = round(four[name], 2)
        results[f"{name}_ratio_4_vs_1"] = round(four[name] / one[name], 3)
    results["all_within_target"] = all(
        results[f"{name}_ratio_4_vs_1"] <= TARGET for name, _ in COMMANDS
    )
    if not args.json_only:
        print(f"{'command':<8}  {'1 node':>8}  {'4 nodes':>8}  {'4 / 1':>6}  target")
        for name, _ in COMMANDS:
            ratio = results[f"{name}_ratio_4_vs_1"]
            print(
                f"{name:<8}  {one[name]:>7.2f}s  {four[name]:>7.2f}s  {ratio:>5.2f}x  "
                f"<= {TARGET}x {'ok' if ratio <= TARGET else 'MISSED'}"
            )
    print(json.dumps(results, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
