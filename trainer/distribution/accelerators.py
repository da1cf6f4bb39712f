"""GPUs: whether this process sees any, and the mixed-precision setting.

A job started on a node with an accelerator is meant to train there: if
the TensorFlow build cannot see a GPU (a CPU-only wheel, a missing or
broken driver, ``CUDA_VISIBLE_DEVICES`` hiding it), TensorFlow silently
trains on the CPU instead, tens of times slower, on the most expensive
machine a user rents. ``check_gpus`` turns that into one line and exit
code 7 when the job asked for a GPU.

Listing physical devices does not initialise TensorFlow's runtime, so the
check may run before the strategy is created (MultiWorkerMirroredStrategy
must configure the collective runtime before that).
"""

from __future__ import annotations

from pathlib import Path

import keras
import tensorflow as tf

from trainer.errors import NoGpu

MIXED_POLICY = "mixed_float16"


def check_gpus(required: bool) -> list[str]:
    """The names of the GPUs TensorFlow sees; ``NoGpu`` when there are none
    and ``required``."""
    gpus = [d.name for d in tf.config.list_physical_devices("GPU")]
    if required and not gpus:
        if tf.test.is_built_with_cuda():
            why = (
                "this TensorFlow has CUDA but finds no GPU: check the driver with nvidia-smi "
                "and that CUDA_VISIBLE_DEVICES does not hide them"
            )
        else:
            why = (
                f"this TensorFlow {tf.__version__} is built without CUDA: install "
                "tensorflow[and-cuda] on the node"
            )
        raise NoGpu(f"this job must run on a GPU and TensorFlow sees none; {why}")
    return gpus


def set_precision(mixed: bool) -> None:
    """Keras' global dtype policy for the layers built after this: float16
    compute with float32 variables, or plain float32."""
    keras.mixed_precision.set_global_policy(MIXED_POLICY if mixed else "float32")


# CPU flags of a native bfloat16 dot product (Intel Cooper Lake and later,
# AMD Zen 4): where a bfloat16 step is faster than a float32 one. Without
# them oneDNN converts every product back to float32, and bfloat16 only
# adds the casts.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")
# GPUs with bfloat16 tensor cores (Ampere and later): compute capability 8.
BF16_GPU_MAJOR = 8


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str]:
    """This machine's CPU flags (Linux); empty where there is no cpuinfo."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    return {
        flag
        for line in text.splitlines()
        if line.startswith("flags")
        for flag in line.partition(":")[2].split()
    }


def bfloat16_native(cpuinfo: str = "/proc/cpuinfo") -> tuple[bool, str]:
    """Whether this process computes bfloat16 natively, and why: every GPU
    it sees has bfloat16 tensor cores, or (without GPUs) the CPU has a
    bfloat16 dot product."""
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        majors = [
            (tf.config.experimental.get_device_details(g).get("compute_capability") or (0, 0))[0]
            for g in gpus
        ]
        native = min(majors) >= BF16_GPU_MAJOR
        return native, f"GPU compute capability {min(majors)}.x"
    flags = cpu_flags(cpuinfo) & set(BF16_CPU_FLAGS)
    if flags:
        return True, "CPU has " + ", ".join(sorted(flags))
    return False, "CPU without " + " or ".join(BF16_CPU_FLAGS)


def replica_devices(strategy: tf.distribute.Strategy) -> list[str]:
    """The devices this process's replicas compute on (for summary.json)."""
    try:
        devices = strategy.extended.worker_devices
    except (AttributeError, NotImplementedError, RuntimeError, ValueError):
        devices = ()  # the default strategy has none: one device, as below
    if devices:
        return [str(d) for d in devices]
    gpus = tf.config.list_logical_devices("GPU")
    return [gpus[0].name if gpus else tf.config.list_logical_devices("CPU")[0].name]


def memory_peaks() -> dict[str, int]:
    """Peak bytes TensorFlow's allocator held on each local GPU so far (none
    without GPUs)."""
    peaks = {}
    for device in tf.config.list_logical_devices("GPU"):
        name = device.name.removeprefix("/device:")
        peaks[name] = int(tf.config.experimental.get_memory_info(name)["peak"])
    return peaks
