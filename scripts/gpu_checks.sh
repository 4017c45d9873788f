#!/usr/bin/env bash
# The checks and benchmarks that need an NVIDIA GPU (H100 / H200; see bench/README.md), in one command.
#
# Prepare first on the development machine: `bash scripts/gpu_prepare.sh` (the nvidia-cutlass wheel in
# .whl/, prebuilt artifacts, the compiled CUTLASS units and bpk-run in .gpu-run/), then run this on the
# lent machine carrying .gpu-run and .whl. In order, each step's output landing in $OUT as it goes (a
# step cut off by the lease still leaves what it printed):
#   1. portable.log   artifacts built without a GPU (the samples in float32 / float16, with cuBLAS and
#                     with cuBLASLt GEMMs), run on this one four ways (numpy, torch + graphs, graphs
#                     off, the C++ bpk-run) against float64 references (scripts/gpu_portable.py)
#   2. hopper.log     the sm_90a GEMM probe, where prepared (scripts/hopper_probe.py; Note [Hopper GEMMs])
#   3. gpu_tests.log  the cuda-marked tests: CUTLASS configs, dispatch and epilogues first (then again with
#                     the Hopper tables on, C++ runtime included), then the samples in float32 / float16,
#                     the fused attention kernels, cuBLASLt's epilogues (float32 / float16 / bfloat16) and
#                     the C++ runtime (built here with the carried headers)
#   4. bench.log      bench.cuda_samples (eager peer), bench.cutlass_gemm (sm80 tables, then Hopper's:
#                     cutlass_gemm_hopper), bench.cuda_graphs --gpu;
#                     results.tgz holds their bench/results/*_<device>.{md,json}
# Name benchmarks to run only those: scripts/gpu_checks.sh cutlass_gemm. Not in the default list (the
# work in flight): gpu_attention (bench.gpu_attention, the fused attention against torch's SDPA, the key
# split and tensor cores against their baselines; about two minutes) and gpu_models (bench.gpu_models,
# real-size models against eager / torch.compile / AOTInductor, built on this machine; GPU_MODELS=bert,vit
# picks models, GPU_PEERS=eager,compile peers; it stops at the budget and says what it skipped) and
# gpu_kernels (bench.gpu_kernels: elementwise, layer norm, softmax, RMS norm, permute and column-reduction kernels' GPU time against a
# copy of the same bytes and torch's kernels, the prepared baseline's beside them; under a minute) and
# cuda_walk (bench.cuda_graphs --gpu --walk: a decode loop, every call a new signature, against eager;
# Note [First calls on the device]; about a minute) and cublaslt_gemm (bench.cublaslt_gemm: a feed-forward
# block's GEMMs with fused epilogues on cuBLASLt against the cuBLAS plan and eager, float16 / bfloat16 /
# float32 at d = 1024; about two minutes, most of it building the six artifacts).
# BUDGET (seconds, default 540) bounds the whole run; later steps get what is left.
# Measured facts of these machines (2026-11-26): torch 2.11, nvcc 13.0.88 (the same build as here, so the
# CUTLASS cache is reused), cuBLAS in /usr/local/cuda, g++ 13, cmake and ninja, no msgpack-cxx headers.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)
budget=${BUDGET:-540}
left() { echo $((budget - ($(date +%s) - start))); }
out="${OUT:-/tmp/gpu_checks}"
mkdir -p "$out"
py="${PYTHON:-python3}"
export PYTHONPATH="$root" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH="/tmp/site:$root"
  export CUTLASS_PATH=/tmp/site/cutlass_library/source  # the path the prepared cache was keyed with
fi
export BLADEPACK_CACHE_DIR="${BLADEPACK_CACHE_DIR:-$root/.gpu-cache}"
export BLADEPACK_NVCC_JOBS="${BLADEPACK_NVCC_JOBS:-$(($(nproc) / 2 > 2 ? $(nproc) / 2 : 2))}"
export BLADEPACK_GEMM_TUNING="${BLADEPACK_GEMM_TUNING:-model}"  # the configs the prepared cache holds
[ -f .gpu-run/cache.tar.xz ] && tar xJf .gpu-run/cache.tar.xz
if [ -f .gpu-run/include.tar.xz ]; then
  mkdir -p .gpu-run/include && tar xJf .gpu-run/include.tar.xz -C .gpu-run/include
  export CMAKE_INCLUDE_PATH="$root/.gpu-run/include" CPATH="$root/.gpu-run/include"
fi
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  nvcc --version | tail -1
  "$py" -c "import torch; print('torch', torch.__version__, torch.cuda.get_device_name())"
} 2>&1 | tee "$out/facts.log"
status=0
if [ -d .gpu-run/art ]; then
  timeout $(($(left) / 3)) env LD_LIBRARY_PATH="$root/.gpu-run/bin:${LD_LIBRARY_PATH:-}" "$py" scripts/gpu_portable.py \
    check .gpu-run/art --bpk-run .gpu-run/bin/bpk-run --out "$out/portable.json" 2>&1 | tee "$out/portable.log" |
    tail -5 || status=1
fi
if [ -f .gpu-run/hopper/instances.json ]; then
  timeout $(($(left) / 4)) "$py" scripts/hopper_probe.py check .gpu-run/hopper 2>&1 | tee "$out/hopper.log" | tail -20
fi
for tests in "tests/test_cutlass_gemm.py tests/test_cutlass_hopper.py" \
  "tests/test_cuda_backend.py tests/test_cuda_attention.py tests/test_cublaslt.py tests/test_cuda_cpp.py"; do
  # shellcheck disable=SC2086
  timeout $(($(left) / 2)) "$py" -m pytest -q -x --tb=short -m cuda -p no:cacheprovider -p no:logging -rs $tests 2>&1 |
    tee -a "$out/gpu_tests.log" | tail -15
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
benches=("$@")
[ ${#benches[@]} -eq 0 ] && benches=(cuda_samples cutlass_gemm cutlass_gemm_hopper cuda_graphs)
for b in "${benches[@]}"; do
  extra=()
  hopper=0
  [ "$b" = cuda_graphs ] && extra=(--gpu)
  [ "$b" = cuda_samples ] && extra=(--peers eager --repeat 20)
  [ "$b" = cutlass_gemm ] && extra=(--repeat 10)
  [ "$b" = gpu_attention ] && extra=(--repeat 10)
  [ "$b" = gpu_kernels ] && extra=(--repeat 20)
  [ "$b" = cublaslt_gemm ] && extra=(--repeat 20 --widths 1024)
  [ "$b" = gpu_kernels ] && [ -d .gpu-run/kernels ] && extra+=(--artifacts .gpu-run/kernels)
  [ "$b" = gpu_kernels ] && [ -d .gpu-run/kernels-base ] && extra+=(--baseline .gpu-run/kernels-base)
  [ "$b" = gpu_models ] && extra=(--repeat 5 --budget $(($(left) - 40)) ${GPU_MODELS:+--models "$GPU_MODELS"}
    ${GPU_PEERS:+--peers "$GPU_PEERS"})
  [ "$b" = cutlass_gemm_hopper ] && b=cutlass_gemm && hopper=1 && extra=(--repeat 10)
  [ "$b" = cuda_walk ] && b=cuda_graphs && extra=(--gpu --walk --samples llama,encoder,mlp --repeat 200)
  [ "$(left)" -gt 20 ] || break
  BLADEPACK_HOPPER_GEMMS=$hopper timeout $(($(left) - 10)) "$py" -m "bench.$b" ${extra[@]+"${extra[@]}"} 2>&1 |
    tee -a "$out/bench.log" | tail -8
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  tar czf "$out/results.tgz" bench/results/*_NVIDIA_* 2>/dev/null
done
echo "gpu_checks: exit $status, $(left) s of the budget left"
exit "$status"
