"""Benchmark of a job's overhead: how long from `deploy.py train` to the
first step, and from the last step to the prompt, against the training
itself? (Not a test: it prints what it measured.)

    .venv/bin/python bench/startup.py [--steps 20] [--rounds 3] [--before REV] [--compose]
                                      [--json-only]

Runs `deploy.py train --steps N` as a user does (a new process, its output
read as it comes) on the local cluster: ps + 2 workers + chief, the CNN in
async mode, MNIST from $MNIST_DIR, each run in a fresh state folder
($TFCLUSTER_HOME) and results folder. Times, from the command's start:

* ``training_start``: the chief's ``training ...`` line (it is about to
  take its first step; the same in every revision);
* ``first_step``: the chief says its first step is done (its ``startup:
  first step`` line); from a chief that does not say it (``--before`` an
  older revision), the first progress line instead, which comes with the
  first call's result (``--log-every 10``: 10 steps in, an upper bound);
* ``last_step``: the last progress line;
* ``end``: the command has exited (the prompt is back).

``training_seconds`` is the chief's (summary.json: from its first step's
start to its last step's end). The overhead is ``end - training_seconds``;
its parts are ``first_step`` and the tail, ``end - last_step`` (final
checkpoint, evaluation, plots, stopping the tasks, the fetch; summary.json's
``finish_s`` has the chief's share, where the chief writes it).

With ``--before REV`` the same runs are made, round by round, with the
revision REV of this repository too (``git archive`` into a temporary
folder; or REV is a folder with a checkout): before and after measured
under the same load. One warm-up run of
each first (page cache), then ``--rounds`` runs, the median of each figure
reported: on a shared machine single runs scatter by seconds. Targets on a
2-core machine: first step within 6 s of the command, the prompt back
within 3 s of the last step.

With ``--compose`` each round also runs the same job (this checkout) on the
docker-compose cluster: examples/compose.yaml with the local cluster's
roles (ps + chief on pc-1, workers pc-2 and pc-3), MNIST from $MNIST_DIR
synced to the nodes by one untimed ``deploy.py up`` first, the cluster's
state (key, pinned host keys) the user's ($TFCLUSTER_HOME), as ``make
cluster-up`` authorized it. A cluster already running is used and left
running; else ``make cluster-up`` starts it (the node image must be there:
``make cluster-image``) and ``make cluster-down`` removes it at the end,
also on failure. It prints the compose/local ratios of first step, tail
and overhead (and the overhead's per round, local and compose runs being
neighbours in time). Target: the compose overhead at most 1.5x the local one.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
FIRST_STEP_TARGET = 6.0
TAIL_TARGET = 3.0
# A progress line per 10 steps: from a chief that does not say when its
# first step is done, the first one comes with the first call's result.
LOG_EVERY = 10
# The docker-compose cluster as `make cluster-up` starts it (mk/cluster.mk):
# compose project "tfcluster", examples/compose.yaml's ports and key.
COMPOSE_YAML = REPO / "examples" / "compose.yaml"
COMPOSE_PROJECT = "tfcluster"
COMPOSE_TARGET = 1.5  # its overhead against the local cluster's (issue 12)
# The local cluster's job: pc-1 the ps and the chief, two workers; pc-4 idles.
COMPOSE_NODES = ["pc-1", "pc-2", "pc-3"]
KEYS = ("training_start", "first_step", "last_step", "end", "tail", "training_seconds", "overhead")


def one_run(checkout: Path, steps: int, folder: Path, config: Path | None = None) -> dict[str, Any]:
    """One `deploy.py train` of ``checkout``: on a fresh local cluster, or
    with ``config`` on that cluster (in the user's state: its key, its pins)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(checkout), "COLUMNS": "200"}
    env.pop("TFCLUSTER_CONFIG", None)  # the embedded local cluster, or --config
    if config is None:
        env["TFCLUSTER_HOME"] = str(folder / "home")
    dest = folder / "results"
    where = ["--config", str(config)] if config else []
    argv = [sys.executable, str(checkout / "deploy.py"), *where, "train", "--model", "cnn",
            "--mode", "async", "--steps", str(steps), "--dest", str(dest), "--", "--log-every",
            str(LOG_EVERY)]  # fmt: skip
    started = time.perf_counter()
    said = first_progress = last_step = training_start = None
    lines: list[str] = []
    with subprocess.Popen(
        argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            now = time.perf_counter() - started
            lines.append(line.rstrip())
            text = line.strip()
            if text.startswith("training ") and training_start is None:
                training_start = now
            if text.startswith("startup: first step") and said is None:
                said = now
            elif text.startswith("step "):
                first_progress = first_progress if first_progress is not None else now
                last_step = now
        code = proc.wait()
    end = time.perf_counter() - started
    if config is None:  # the fresh cluster's network namespace (if any) ends with it
        subprocess.run([*argv[:2], "down", "--yes"], cwd=folder, env=env, capture_output=True)
    if code != 0 or last_step is None or first_progress is None or training_start is None:
        raise SystemExit(f"deploy.py train failed (exit {code}):\n" + "\n".join(lines[-20:]))
    (run_dir,) = dest.iterdir()
    summary = json.loads((run_dir / "summary.json").read_text())
    training = float(summary["training_seconds"])
    return {
        "training_start": training_start,
        "first_step": said if said is not None else first_progress,
        "last_step": last_step,
        "end": end,
        "tail": end - last_step,
        "training_seconds": training,
        "overhead": end - training,
        "said_first_step": said is not None,
        "startup_s": summary.get("startup_s"),
        "finish_s": summary.get("finish_s"),
    }


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: statistics.median(r[k] for r in runs) for k in KEYS}
    for part in ("startup_s", "finish_s"):
        found = [r[part] for r in runs if isinstance(r[part], dict)]
        if found:
            out[part] = {k: statistics.median(p[k] for p in found if k in p) for k in found[0]}
    out["said_first_step"] = all(r["said_first_step"] for r in runs)
    out["rounds"] = {k: [round(r[k], 2) for r in runs] for k in KEYS}
    return out


def show(name: str, result: dict[str, Any], targets: bool = True) -> None:
    first = "command -> first step" if result["said_first_step"] else "command -> 1st progress"
    # The seconds targets are the local cluster's; the compose one is a ratio.
    first_goal = f"target <= {FIRST_STEP_TARGET:.0f} s" if targets else ""
    tail_goal = f"target <= {TAIL_TARGET:.0f} s" if targets else ""
    rows = [
        ("command -> training start", result["training_start"], "the chief's start line"),
        (first, result["first_step"], first_goal),
        ("last step -> prompt", result["tail"], tail_goal),
        ("command -> prompt", result["end"], ""),
        ("training (chief)", result["training_seconds"], ""),
        ("overhead", result["overhead"],
         f"{result['end'] / result['training_seconds']:.1f}x the training time"),
    ]  # fmt: skip
    print(f"{name}:")
    for label, seconds, note in rows:
        print(f"  {label:<26}{seconds:6.1f} s   {note}")
    for part in ("startup_s", "finish_s"):
        if part in result:
            text = ", ".join(f"{k} {v:.2f}" for k, v in result[part].items())
            print(f"  {part} (summary.json): {text}")


# -- the docker-compose cluster ------------------------------------------------


def compose_config(folder: Path, mnist: Path) -> Path:
    """examples/compose.yaml with the local cluster's roles (ps + chief on
    pc-1, workers pc-2 and pc-3) and $MNIST_DIR synced to the nodes. Its name
    stays "compose": the key `make cluster-up` authorized is that state's."""
    data = yaml.safe_load(COMPOSE_YAML.read_text())
    data["nodes"] = COMPOSE_NODES
    data["roles"]["worker"] = COMPOSE_NODES[1:]
    data["hosts"] = {node: data["hosts"][node] for node in COMPOSE_NODES}
    setup = data["setup"]
    # Relative paths are from the file's folder, and this copy is elsewhere.
    setup["wheelhouse"] = os.path.normpath(COMPOSE_YAML.parent / setup["wheelhouse"])
    setup["sync"] = [str(mnist)]
    data["job"]["data_dir"] = f"{setup['remote_dir']}/{mnist.name}"
    path = folder / "compose.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _make(target: str, *done: str) -> None:
    """``make TARGET`` (mk/cluster.mk) with this Python; ``done``: targets
    taken as made (-o), the venv always (it runs this)."""
    old = [arg for name in (".venv/.installed", *done) for arg in ("-o", name)]
    argv = ["make", "-C", str(REPO), f"PY={sys.executable}", *old, target]
    finished = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if finished.returncode != 0:
        tail = (finished.stdout + finished.stderr)[-3000:]
        raise SystemExit(f"make {target} failed (exit {finished.returncode}):\n{tail}")


@contextmanager
def compose_cluster(say: Callable[[str], None]) -> Iterator[None]:
    """The compose cluster running while the block runs: as found when it
    runs; else started with `make cluster-up` and taken down again with
    `make cluster-down` (whatever happens in the block)."""
    label = f"label=com.docker.compose.project={COMPOSE_PROJECT}"
    try:
        found = subprocess.run(
            ["docker", "ps", "-q", "-f", label], capture_output=True, text=True
        )
    except FileNotFoundError:
        raise SystemExit("--compose: no `docker` command here; it needs Docker") from None
    if found.returncode != 0:
        raise SystemExit(f"--compose: docker does not answer: {found.stderr.strip()}")
    running = len(found.stdout.split())
    nodes = len(yaml.safe_load(COMPOSE_YAML.read_text())["nodes"])
    if running == nodes:
        say(f"compose cluster: running (project {COMPOSE_PROJECT}), left running")
        yield
        return
    if running:
        raise SystemExit(
            f"--compose: {running} of the compose cluster's {nodes} containers run: "
            "`make cluster-down` (or `make cluster-up`), then run this again"
        )
    image = os.environ.get("NODE_IMAGE", "tfcluster/node:local")
    if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode:
        raise SystemExit(f"--compose: no node image {image}: `make cluster-image` builds it")
    say("compose cluster: starting it (make cluster-up), make cluster-down at the end")
    try:
        _make("cluster-up", "cluster-image")  # the image is there: no rebuild check
        yield
    except BaseException:
        # Down again, but the error shown is the one that ended the block.
        with contextlib.suppress(SystemExit):
            _make("cluster-down")
        raise
    _make("cluster-down")
    say("compose cluster: down again")


def compose_up(config: Path) -> None:
    """`deploy.py up` once (not timed): keys pinned, install checked, code and
    MNIST synced, as a user does before training."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"}
    argv = [sys.executable, str(REPO / "deploy.py"), "--config", str(config), "up"]
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=900
    )
    if done.returncode != 0:
        raise SystemExit(f"deploy.py up on the compose cluster failed:\n{done.stdout[-3000:]}")


Setup = tuple[str, Path, Path | None]  # (name, checkout, compose config or None)


def checkouts_to_measure(before: str | None, tmp: Path) -> dict[str, Path]:
    """This checkout, and with ``before`` that one too (a folder, or a git
    revision unpacked into ``tmp``)."""
    if before and Path(before).is_dir():  # a checkout of its own
        return {"before": Path(before).resolve(), "now": REPO}
    if not before:
        return {"now": REPO}
    old = tmp / "before"
    old.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", before],
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
    return {"before": old, "now": REPO}


def measure(
    setups: list[Setup], rounds: int, steps: int, tmp: Path, say: Callable[[str], None]
) -> dict[str, list[dict[str, Any]]]:
    """Every set-up in every round, after a round of warm-up that is not kept."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in setups}
    for i in range(rounds + 1):
        for name, checkout, config in setups:
            folder = tmp / f"{name}-{i}"
            folder.mkdir()
            result = one_run(checkout, steps, folder, config)
            if i == 0:
                continue  # warm-up: page cache, the local cluster's folders
            runs[name].append(result)
            say(
                f"round {i} {name}: first step {result['first_step']:.1f} s, last "
                f"step {result['last_step']:.1f} s, end {result['end']:.1f} s, "
                f"training {result['training_seconds']:.1f} s"
            )
    return runs


def summarise(runs: dict[str, list[dict[str, Any]]], args: Any) -> dict[str, Any]:
    """Each set-up's medians, and the compose cluster's against the local one's."""
    results: dict[str, Any] = {name: medians(found) for name, found in runs.items()}
    results.update(steps=args.steps, cpus=os.cpu_count(), load=os.getloadavg()[0])
    if args.before:
        results["before_rev"] = args.before
    if args.compose:
        local, compose = results["now"], results["compose"]
        results["compose_vs_local"] = {
            k: compose[k] / local[k] for k in ("first_step", "tail", "overhead")
        } | {
            "overhead_rounds": [
                c["overhead"] / n["overhead"]
                for n, c in zip(runs["now"], runs["compose"], strict=True)
            ],
            "target": COMPOSE_TARGET,
        }
    return results


def print_summary(results: dict[str, Any], checkouts: list[str], args: Any) -> None:
    print(
        f"\n{'local and compose clusters' if args.compose else 'local cluster'}, "
        f"ps + 2 workers + chief, cnn async, {args.steps} steps, medians "
        f"of {args.rounds} runs ({os.cpu_count()} CPUs, load {results['load']:.1f} at the end)"
    )
    for name in checkouts:
        show(f"{name} ({args.before})" if name == "before" else name, results[name])
    if args.before:
        before, now = results["before"], results["now"]
        print(
            f"after/before: training start "
            f"{now['training_start'] / before['training_start']:.2f}x, "
            f"first step {now['first_step'] / before['first_step']:.2f}x, "
            f"tail {now['tail'] / before['tail']:.2f}x, "
            f"overhead {now['overhead'] / before['overhead']:.2f}x"
        )
    if args.compose:
        show("compose (docker-compose cluster, over ssh)", results["compose"], targets=False)
        ratio = results["compose_vs_local"]
        verdict = "met" if ratio["overhead"] <= COMPOSE_TARGET else "NOT met"
        print(
            f"compose/local: first step {ratio['first_step']:.2f}x, "
            f"tail {ratio['tail']:.2f}x, overhead {ratio['overhead']:.2f}x "
            f"(target <= {COMPOSE_TARGET}x: {verdict}; per round "
            f"{', '.join(f'{r:.2f}x' for r in ratio['overhead_rounds'])})"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3, choices=range(1, 11),
                        metavar="N", help="runs measured (1-10); medians are reported")  # fmt: skip
    parser.add_argument(
        "--before", metavar="REV", help="also measure this git revision (or checkout folder)"
    )
    parser.add_argument(
        "--compose", action="store_true",
        help="also on the docker-compose cluster (started and stopped if not running)",
    )  # fmt: skip
    parser.add_argument("--json-only", action="store_true")
    args = parser.parse_args()
    if not os.environ.get("MNIST_DIR"):
        print("set MNIST_DIR to a folder of the MNIST files", file=sys.stderr)
        return 2

    def say(text: str) -> None:
        if not args.json_only:
            print(text, flush=True)

    with tempfile.TemporaryDirectory(prefix="tfcluster-bench-startup-") as tmp, ExitStack() as on:
        checkouts = checkouts_to_measure(args.before, Path(tmp))
        # The local cluster of each checkout, then this checkout on the
        # compose cluster, in every round.
        setups: list[Setup] = [(n, c, None) for n, c in checkouts.items()]
        if args.compose:
            on.enter_context(compose_cluster(say))
            config = compose_config(Path(tmp), Path(os.environ["MNIST_DIR"]).absolute())
            compose_up(config)
            setups.append(("compose", REPO, config))
        runs = measure(setups, args.rounds, args.steps, Path(tmp), say)
    results = summarise(runs, args)
    if not args.json_only:
        print_summary(results, list(checkouts), args)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
