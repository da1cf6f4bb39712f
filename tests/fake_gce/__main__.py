"""The fake Compute API as a server process of its own, for what is not a
test (bench/up.py): ``python -m tests.fake_gce [--provision S] ...``.

Prints one line, ``endpoint http://127.0.0.1:PORT``, once it listens, then
serves until its standard input ends (the parent closed it, or died) or it
is terminated. A benchmark so measures the client against a server in
another process, as the real API is, and imports nothing of tests/.
"""

from __future__ import annotations

import argparse
import signal
import sys

from tests.fake_gce import FakeGce, Latency


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.fake_gce", description=__doc__)
    for state in ("provision", "staging", "start", "stop", "delete", "firewall"):
        parser.add_argument(f"--{state}", type=float, default=0.0, help=f"seconds of {state}")
    parser.add_argument(
        "--wait-max", type=float, default=5.0, help="the longest operations.wait (seconds)"
    )
    parser.add_argument("--port", type=int, default=0, help="default: a free one")
    args = parser.parse_args()
    latency = Latency(
        provision=args.provision,
        staging=args.staging,
        start=args.start,
        stop=args.stop,
        delete=args.delete,
        firewall=args.firewall,
    )
    # Terminated: leave the ``with`` as at the end of input (the fake stops).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with FakeGce(latency=latency, wait_max_s=args.wait_max, port=args.port) as fake:
        print(f"endpoint {fake.endpoint}", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main())
