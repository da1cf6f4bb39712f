"""`make test`: the suite as two pytest sessions at once, the docker tests
in one and the rest in the other, when both are selected.

Why: the docker tests spend most of their time waiting (a node that must
stop itself after 45 s of idleness, a preempted VM brought back, sshd
containers booting), and the rest are mostly CPU (real TensorFlow jobs). In
one session the waits leave the cores idle: a clean-clone CI run kept a
2-core machine 51% busy, in 21:19. Side by side, the waits overlap the CPU
work: 16:17 on the same machine.

    python scripts/test_streams.py [-m MARKERS] [PYTEST ARGS ...]

``-m`` (the Makefile's TEST_MARKERS, or one in PYTEST_ARGS: the last one
counts, as in pytest) narrows both sessions. One plain pytest session runs
instead without a Docker engine that answers, with
TFCLUSTER_TEST_ONE_SESSION=1, and with options that need the terminal or
name one output for the run (``--pdb``, ``-s``, ``--junitxml``,
``--basetemp``, ...). The rest's output comes as it runs; the docker
session's goes to a temporary file, printed once it is done, then removed.
The exit code is the first failing session's (128 + N for one killed by
signal N); a session that selected no tests (pytest's 5) fails only if
both did.

Each session runs in a process group of its own: Ctrl-C (or a SIGTERM of
a CI timeout) reaches each once, through this script, and each stops its
tests' clusters and containers as pytest does on an interrupt; neither is
ever killed. With ``-x``/``--maxfail``, the first session to fail
interrupts the other.

The two sessions share nothing they could both write: each has its own
temporary folders (pytest numbers them), its own cache folder, and the
docker tests' containers carry their session's label.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

REPO = Path(__file__).resolve().parents[1]
DOCKER = "docker"
NO_TESTS = 5  # pytest's exit code when a session selected no tests
INTERRUPTED = 130
# Options after which one session runs: a debugger or an uncaptured test
# needs the terminal, which a second session cannot share; the others name
# one file or folder that two sessions would both write (or delete).
ONE_SESSION = ("--pdb", "--trace", "-s", "--capture", "--basetemp", "--junitxml",
               "--junit-xml", "--report-log", "--resultlog")  # fmt: skip
STOP_EARLY = ("-x", "--exitfirst", "--maxfail", "--sw", "--stepwise")


def docker_answers() -> bool:
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def split(args: list[str]) -> tuple[str, list[str]]:
    """Every ``-m EXPR`` / ``-mEXPR`` taken out of ``args``: the last
    expression (pytest's rule; "" for none) and the other arguments."""
    markers, rest = "", []
    items = iter(args)
    for arg in items:
        if arg == "-m":
            markers = next(items, "")
        elif arg.startswith("-m"):
            markers = arg[2:]
        else:
            rest.append(arg)
    return markers, rest


def uses(args: list[str], options: tuple[str, ...]) -> bool:
    """Whether any of ``options`` is among ``args`` (``--opt=value`` too)."""
    return any(a == o or a.startswith(o + "=") for a in args for o in options)


def narrowed(own: str, markers: str) -> str:
    return f"{own} and ({markers})" if markers else own


def combined(codes: list[int]) -> int:
    """The sessions' exit codes as one: the first failure (a session killed
    by signal N as 128 + N); 5 (no tests) only when every session selected
    none."""
    codes = [128 - c if c < 0 else c for c in codes]
    failures = [c for c in codes if c not in (0, NO_TESTS)]
    if failures:
        return failures[0]
    return NO_TESTS if all(c == NO_TESTS for c in codes) else 0


def pytest(markers: str, args: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", markers, *args]


def two_sessions(markers: str, args: list[str]) -> int:
    if uses(args, ("--lf", "--last-failed")) and not uses(
        args, ("--lfnf", "--last-failed-no-failures")
    ):
        # Each session keeps its own failures: one with none runs nothing,
        # not everything.
        args = [*args, "--lfnf=none"]
    docker_args = list(args)
    if "no:cacheprovider" not in args:
        # Its own cache folder: two sessions writing one lastfailed file
        # would lose one's failures.
        docker_args += ["-o", "cache_dir=.pytest_cache/docker-session"]
    handle, name = tempfile.mkstemp(prefix="tfcluster-docker-tests-", suffix=".log")
    log = Path(name)
    print("test_streams: the docker tests run meanwhile in a session of their own", flush=True)
    interrupted = False
    stop_early = uses(args, STOP_EARLY)
    with os.fdopen(handle, "w") as out:
        docker = subprocess.Popen(
            pytest(narrowed(DOCKER, markers), docker_args),
            cwd=REPO, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            process_group=0,
        )  # fmt: skip
        rest = subprocess.Popen(
            pytest(narrowed(f"not {DOCKER}", markers), args), cwd=REPO, process_group=0
        )
        sessions = [rest, docker]

        def stop_all() -> None:
            for session in sessions:
                if session.poll() is None:
                    session.send_signal(signal.SIGINT)

        def interrupt(signum: int, frame: FrameType | None) -> None:
            nonlocal interrupted
            interrupted = True
            stop_all()

        caught = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
        before = {s: signal.signal(s, interrupt) for s in caught}
        try:
            stopped = False
            while any(s.poll() is None for s in sessions):
                failed = any(s.returncode not in (None, 0, NO_TESTS) for s in sessions)
                if stop_early and failed and not stopped:
                    stop_all()  # as pytest's own -x: the first failure ends the run
                    stopped = True
                time.sleep(0.5)
        finally:
            for s, handler in before.items():
                signal.signal(s, handler)
    print("\n" + "=" * 30 + " the docker tests' session " + "=" * 30, flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    sys.stdout.flush()
    log.unlink()
    codes = [rest.returncode, docker.returncode]
    result = INTERRUPTED if interrupted else combined(codes)
    print(
        f"test_streams: the other tests' session exited {codes[0]} (its output is above the "
        f"docker session's), the docker tests' {codes[1]}: exit {result}"
    )
    return result


def main(argv: list[str]) -> int:
    markers, args = split(argv)
    one = (
        os.environ.get("TFCLUSTER_TEST_ONE_SESSION") == "1"
        or uses(args, ONE_SESSION)
        or not docker_answers()
    )
    if one:
        # pytest itself, in this process: Ctrl-C is its own to handle.
        os.chdir(REPO)
        command = pytest(markers, args)
        os.execv(command[0], command)
    return two_sessions(markers, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
