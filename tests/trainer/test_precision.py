"""Async mode's bfloat16 default: on only where the hardware computes
bfloat16 natively (trainer/distribution/accelerators.py), read from recorded cpuinfo."""

from __future__ import annotations

from pathlib import Path

import pytest
import tensorflow as tf

from trainer.distribution.accelerators import bfloat16_native, cpu_flags

# /proc/cpuinfo's flags lines, shortened, of a Sapphire Rapids (c3) and a
# Cascade Lake (n2) Compute Engine machine.
SAPPHIRE_RAPIDS = (
    "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n\n"
    "processor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
)
CASCADE_LAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"


@pytest.fixture(autouse=True)
def no_gpus() -> None:
    if tf.config.list_physical_devices("GPU"):
        pytest.skip("the CPU rule applies without GPUs")


def test_a_cpu_with_a_bfloat16_dot_product_computes_in_bfloat16(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(SAPPHIRE_RAPIDS)
    assert {"avx512_bf16", "amx_bf16"} <= cpu_flags(str(info))
    assert bfloat16_native(str(info)) == (True, "CPU has amx_bf16, avx512_bf16")


def test_a_cpu_without_one_stays_in_float32(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    info.write_text(CASCADE_LAKE)
    native, why = bfloat16_native(str(info))
    assert not native and "avx512_bf16" in why


def test_no_cpuinfo_means_no_bfloat16(tmp_path: Path) -> None:
    assert cpu_flags(str(tmp_path / "absent")) == set()
    assert bfloat16_native(str(tmp_path / "absent"))[0] is False
