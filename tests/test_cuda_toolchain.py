"""nvcc builds a cubin per architecture plus PTX, cached by content (no GPU needed)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bladepack.codegen.cuda_toolchain import (
    build_images,
    cubin_arch,
    hopper_gemms,
    kernel_targets,
    targets,
)
from bladepack.codegen.toolchain import ToolchainError
from bladepack.loader.cuda_driver import choose_image
from bladepack.target import CUBIN_ARCHES, HOPPER_GEMM_ARCH, PTX_ARCH

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not found")

SOURCE = r"""
#include <cuda_fp16.h>
extern "C" __global__ void axpy(float* y, const float* x, __half a, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = __half2float(a) * x[i] + y[i];
}
"""


def test_every_architecture_and_ptx(tmp_path: Path) -> None:
    # sm_90a (the Hopper CUTLASS GEMMs) only when named: Note [Hopper GEMMs]
    assert targets() == [*CUBIN_ARCHES, PTX_ARCH] and not hopper_gemms()
    assert hopper_gemms(["sm_90", HOPPER_GEMM_ARCH]) and targets([HOPPER_GEMM_ARCH]) == [HOPPER_GEMM_ARCH]
    assert kernel_targets() == [*CUBIN_ARCHES, PTX_ARCH]
    assert kernel_targets(["sm_90a"]) == ["sm_90"] and not hopper_gemms(["sm_90", "compute_90"])
    images = build_images(SOURCE, tmp_path)
    assert sorted(images) == sorted([*CUBIN_ARCHES, PTX_ARCH])
    for arch in CUBIN_ARCHES:
        assert cubin_arch(images[arch]) == arch
    ptx = images[PTX_ARCH].decode()
    assert ".target sm_90" in ptx and ".entry axpy" in ptx
    # what a loader picks on each GPU generation
    picks = {cc: choose_image(images, cc)[0] for cc in [(8, 0), (8, 6), (8, 7), (8, 9), (9, 0), (10, 0), (12, 0)]}
    assert picks == {
        (8, 0): "sm_80",
        (8, 6): "sm_86",
        (8, 7): "sm_86",
        (8, 9): "sm_89",
        (9, 0): "sm_90",
        (10, 0): PTX_ARCH,
        (12, 0): PTX_ARCH,
    }


def test_cache_and_errors(tmp_path: Path) -> None:
    first = build_images(SOURCE, tmp_path, configured="sm_90")
    assert len(list((tmp_path / "cuda").glob("*.cubin"))) == 1
    # an nvcc that reports the same version but cannot compile: the second build must come from the cache
    fake = tmp_path / "nvcc"
    fake.write_text(f'#!/bin/sh\n[ "$1" = --version ] && exec {shutil.which("nvcc")} --version\nexit 1\n')
    fake.chmod(0o755)
    assert build_images(SOURCE, tmp_path, nvcc=str(fake), configured="sm_90") == first
    with pytest.raises(ToolchainError, match="nvcc failed building the sm_90 kernels"):
        build_images(SOURCE + "\n// changed", tmp_path, nvcc=str(fake), configured="sm_90")
    with pytest.raises(ToolchainError, match=r"nvcc failed building the sm_90 kernels:\n.*undefined"):
        build_images(SOURCE.replace("__half2float(a)", "undefined_fn(a)"), tmp_path, configured="sm_90")
    with pytest.raises(ToolchainError, match=r"BLADEPACK_CUDA_ARCHES names \['sm_75'\]"):
        build_images(SOURCE, tmp_path, configured="sm_75")
    with pytest.raises(ValueError, match="not a cubin"):
        cubin_arch(b"//ptx")


def test_nvcc_jobs_from_the_environment() -> None:
    from bladepack.options import CompileOptions

    assert CompileOptions.from_env({}).nvcc_jobs == 2
    assert CompileOptions.from_env({"BLADEPACK_NVCC_JOBS": "12"}).nvcc_jobs == 12
    with pytest.raises(ValueError, match="BLADEPACK_NVCC_JOBS='0': expected a positive integer"):
        CompileOptions.from_env({"BLADEPACK_NVCC_JOBS": "0"})
