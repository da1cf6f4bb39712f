"""What a node has, asked in shell: its GPUs as ``nvidia-smi`` sees them
(``status``), whether the NVIDIA driver works and TensorFlow sees the GPUs,
and the TensorFlow its image brings (``setup``). Apart from the task
commands (commands.py): these ask about the machine, not about a job; what
they print is parsed in facts.py.
"""

from __future__ import annotations

import shlex

from infra.node.commands import path
from infra.transport.base import NodeLayout

# nvidia-smi's query interface: one CSV line per GPU, units left out
# (memory.total in MiB, utilization.gpu in %), stable across driver versions
# (`nvidia-smi --help-query-gpu`), unlike its table.
GPU_FIELDS = ("name", "memory.total", "utilization.gpu")


def gpu_query() -> str:
    """The node's GPUs as ``nvidia-smi`` sees them: one ``NAME, MiB, %`` line
    per GPU; ``no nvidia-smi`` where it is not installed (no NVIDIA driver:
    a CPU node); what it printed and ``@nvidia-smi-exit N`` when it failed
    (a driver that does not load). Always exits 0: no GPU is an answer."""
    query = " ".join(
        [
            "nvidia-smi",
            "--query-gpu=" + ",".join(GPU_FIELDS),
            "--format=csv,noheader,nounits",
        ]
    )
    return (
        "if ! command -v nvidia-smi >/dev/null 2>&1; then echo 'no nvidia-smi'; exit 0; fi\n"
        f"{query} 2>&1\n"
        'c=$?; [ "$c" = 0 ] || echo "@nvidia-smi-exit $c"; exit 0'
    )


# -- what a node's image brings (setup) ---------------------------------------------------

# A Deep Learning VM image installs the NVIDIA driver on first boot (with
# metadata install-nvidia-driver=True), which may still run when setup
# starts; its images carry /opt/deeplearning.
DRIVER_WAIT_S = 300


def system_tensorflow(python: str) -> str:
    """The TensorFlow the node's own ``python`` has (a Deep Learning VM image
    with TensorFlow ships one): ``@tfcluster system-tensorflow VERSION``, or
    ``none``. See ``facts.parse_system_tensorflow``."""
    code = (
        "import importlib.metadata as m\n"
        "for d in ('tensorflow', 'tensorflow-cpu', 'tensorflow-gpu'):\n"
        "    try:\n"
        "        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
    )
    return (
        f"v=$({shlex.quote(python)} -c {shlex.quote(code)} 2>/dev/null | head -n 1)\n"
        'echo "@tfcluster system-tensorflow ${v:-none}"'
    )


def gpu_check(layout: NodeLayout, wait_s: int = DRIVER_WAIT_S) -> str:
    """Whether the NVIDIA driver works (waiting up to ``wait_s`` on a Deep
    Learning VM image, whose first boot installs it) and how many GPUs
    TensorFlow in the node's venv sees: ``@tfcluster driver yes|no`` and
    ``@tfcluster tf-gpus N``. See ``facts.parse_gpu_check``."""
    code = (
        "import tensorflow as tf\n"
        "print('@tfcluster tf-gpus', len(tf.config.list_physical_devices('GPU')))\n"
    )
    return "\n".join(
        [
            'export H="$PWD"',
            "ok() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }",
            "if [ -d /opt/deeplearning ]; then",
            f"  n=0; while ! ok && [ $n -lt {int(wait_s)} ]; do sleep 5; n=$((n + 5)); done",
            "fi",
            "if ok; then echo '@tfcluster driver yes'; else echo '@tfcluster driver no'; fi",
            f"{path(layout.python)} -c {shlex.quote(code)} || echo '@tfcluster tf-gpus error'",
        ]
    )
