"""`make test`: the suite as two pytest sessions at once, the docker tests
in one and the rest in the other, when both are selected.

Why: the docker tests spend most of their time waiting (a node that must
stop itself after 45 s of idleness, a preempted VM brought back, sshd
containers booting), and the rest are mostly CPU (real TensorFlow jobs). In
one session the waits leave the cores idle: a whole run measured 38% busy
on a 2-core machine. Run side by side, the waits overlap the CPU work.

    python scripts/test_streams.py [-m MARKERS] [PYTEST ARGS ...]

With ``-m`` (a marker expression of the caller's: ``make test
TEST_MARKERS=...``), or without a Docker engine that answers, or with
TFCLUSTER_TEST_STREAMS=1, it is one plain pytest session, as before. The
rest's output comes as it runs; the docker session's goes to a log file,
printed whole once it is done. Its exit code is the first failing one's:
a session that selected no tests (pytest's 5) fails only if both did.

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
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCKER = "docker"
NO_TESTS = 5  # pytest's exit code when a session selected no tests


def docker_answers() -> bool:
    try:
        done = subprocess.run(["docker", "info"], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def pytest(markers: str, args: list[str], *extra: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", markers, *extra, *args]


def combined(codes: list[int]) -> int:
    """The sessions' exit codes as one: the first failure; 5 (no tests)
    only when every session selected none."""
    failures = [c for c in codes if c not in (0, NO_TESTS)]
    if failures:
        return failures[0]
    return NO_TESTS if all(c == NO_TESTS for c in codes) else 0


def split(args: list[str]) -> tuple[str | None, list[str]]:
    """``-m MARKERS`` (first, as the Makefile passes it) and the rest."""
    if len(args) >= 2 and args[0] == "-m":
        return args[1], args[2:]
    return None, args


def main(argv: list[str]) -> int:
    markers, args = split(argv)
    if markers or os.environ.get("TFCLUSTER_TEST_STREAMS") == "1" or not docker_answers():
        # The caller chose what runs (or there is no second session to run).
        return subprocess.call(pytest(markers or "", args), cwd=REPO)
    log = Path(tempfile.mkstemp(prefix="tfcluster-docker-tests-", suffix=".log")[1])
    print(f"test_streams: the docker tests run meanwhile in a session of their own (log: {log})")
    sys.stdout.flush()
    with log.open("w") as out:
        docker = subprocess.Popen(
            # Its own cache folder: two sessions writing one lastfailed file
            # would lose one's failures.
            pytest(DOCKER, args, "-o", "cache_dir=.pytest_cache/docker-session"),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            rest = subprocess.call(pytest(f"not {DOCKER}", args), cwd=REPO)
            print("\ntest_streams: waiting for the docker tests' session ...", flush=True)
            code = docker.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached both sessions (one process group); each stops
            # its own tests' clusters. Wait for that, as pytest would.
            docker.send_signal(signal.SIGINT)
            docker.wait()
            raise
    print("\n" + "=" * 30 + " the docker tests' session " + "=" * 30, flush=True)
    sys.stdout.write(log.read_text(errors="replace"))
    sys.stdout.flush()
    result = combined([rest, code])
    print(f"test_streams: the rest exited {rest}, the docker tests {code}: exit {result}")
    if result == 0:
        log.unlink()
    return result


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
