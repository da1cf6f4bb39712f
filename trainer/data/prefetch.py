"""``python -m trainer.data.prefetch [trainer flags]``: fetch what a run with
these flags would download (MNIST, into its cache), then exit; prints the
data folder. The local cluster runs it on this machine's network before
its tasks start in a network namespace that has none
(infra/providers/local.py, ``LocalProvider.before_tasks``). Errors as
``python -m trainer`` says them: ``trainer: error: ...`` and its exit code."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from trainer.data.mnist import resolve_data_dir
from trainer.errors import TrainerError
from trainer.flags import parse_args


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    try:
        print(resolve_data_dir(config.data_dir), flush=True)
    except TrainerError as e:
        print(f"trainer: error: {e}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
