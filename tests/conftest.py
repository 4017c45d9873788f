from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

# Build only the kernel library for this CPU's best ISA level in tests (one test builds all levels).
os.environ.setdefault("BLADEPACK_CPU_ISAS", "host")

import pytest
import torch
from hypothesis import settings

import bladepack
from samples.mlp import MLP
from tests.helpers import no_dense_layers

if TYPE_CHECKING:
    from tests.cuda_harness import FakeGpu

# Property tests draw the same examples on every run of the suite (CI must not go red on a draw it never
# made before); `pytest --hypothesis-profile=explore` draws fresh ones and finds new counterexamples,
# which then become @example cases.
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", max_examples=200)
settings.load_profile("ci")


@pytest.fixture(scope="session")
def mlp_artifact() -> bladepack.api.Artifact:
    """The MLP sample's plan with its linear layers as BLAS GEMMs (BLADEPACK_DENSE_LAYERS=0): the loader,
    format and plan-check tests edit and check its GEMM launch records, which the default plan (dense
    kernels, Note [Dense layers]: tests/test_dense_layers.py) no longer has for weights this small."""
    torch.manual_seed(0)
    model = MLP().eval()
    return bladepack.optimize(
        model,
        [(torch.randn(2, 64),), (torch.randn(4, 64),)],
        dynamic_shapes={"x": {0: bladepack.Dim("batch", 1, 64)}},
        options=no_dense_layers(),
    )


@pytest.fixture(scope="session")
def two_input_artifact() -> bladepack.api.Artifact:
    class M(torch.nn.Module):
        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return (x * mask[..., None]).sum(1)

    samples = [(torch.randn(2, 5, 3), torch.ones(2, 5)), (torch.randn(3, 7, 3), torch.ones(3, 7))]
    return bladepack.optimize(M(), samples)


@pytest.fixture(scope="session")
def release() -> Path:
    """cpp_runtime built in its release configuration with the test programs (tests/cpp_build.py)."""
    from tests import cpp_build

    return cpp_build.build("release")


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> FakeGpu:
    """The fake CUDA driver and libraries, kernels emulated on the CPU (tests/cuda_harness.py), one per
    test module (a module may override it: test_cuda_cpp builds the C++ runtime first)."""
    from tests.cuda_harness import FakeGpu

    return FakeGpu(tmp_path_factory.mktemp("fake_gpu"))
