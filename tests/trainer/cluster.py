"""The loopback jobs of the trainer's tests: infra/loopback.py (a library
module, so that bench/trainer.py needs nothing of tests/)."""

from infra.loopback import REPO, LocalJob, free_ports, local_job, read_summary, task_env

__all__ = ["REPO", "LocalJob", "free_ports", "local_job", "read_summary", "task_env"]
