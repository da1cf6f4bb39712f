"""The loopback jobs of the trainer's tests: bench/support/loopback.py
(beside the benchmarks, so that bench/trainer.py needs nothing of tests/)."""

from bench.support.loopback import REPO, LocalJob, free_ports, local_job, read_summary, task_env

__all__ = ["REPO", "LocalJob", "free_ports", "local_job", "read_summary", "task_env"]
