"""``python -m tests.fake_gcs [--port N] [--bucket NAME]...``: the fake as a
process of its own (a docker test's node reaches it on the host)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import threading

from tests.fake_gcs.server import FakeGcs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bucket", action="append", default=[])
    args = parser.parse_args()
    fake = FakeGcs(host=args.host, port=args.port).start()
    for name in args.bucket:
        fake.create_bucket(name)
    print(fake.endpoint, flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with contextlib.suppress(KeyboardInterrupt):
        done.wait()
    fake.stop()


if __name__ == "__main__":
    main()
