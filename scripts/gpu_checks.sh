#!/usr/bin/env bash
# The checks and benchmarks that need an NVIDIA GPU (H100 / H200; see bench/README.md), in one command:
# the GPU-marked tests (real-hardware numerics of the generated kernels, every CUTLASS config and
# epilogue, the samples, the C++ runtime's CUDA path against the Python loader), then bench.cutlass_gemm,
# bench.cuda_samples and bench.cuda_graphs --gpu (host time per call, graphs on / off, both loaders). Results land in
# bench/results/ and, when $OUT is set (the device tool), are copied there with the test log.
#
# The GPU machines have torch, cuda-bindings, pytest, hypothesis, sympy and msgpack but not
# nvidia-cutlass: download its pure-Python wheel into .whl/ here
#   python3 -m pip download --no-deps --only-binary=:all: -d .whl nvidia-cutlass==4.2.0.0
# and carry .whl; this script installs what it finds there into /tmp/site.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
py="${PYTHON:-python3}"
export PYTHONPATH="$root" PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit
  export PYTHONPATH="/tmp/site:$root"
fi
export BLADEPACK_CACHE_DIR="${BLADEPACK_CACHE_DIR:-$root/.gpu-cache}"
export BLADEPACK_NVCC_JOBS="${BLADEPACK_NVCC_JOBS:-$(( $(nproc) / 2 > 2 ? $(nproc) / 2 : 2 ))}"
log="${OUT:-/tmp}/gpu_tests.log"
"$py" -m pytest -q -m cuda -p no:cacheprovider tests/ 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
benches=("$@")
[ ${#benches[@]} -eq 0 ] && benches=(cutlass_gemm cuda_samples cuda_graphs)  # or name them: scripts/gpu_checks.sh cutlass_gemm
for b in "${benches[@]}"; do
  extra=()
  [ "$b" = cuda_graphs ] && extra=(--gpu)
  "$py" -m "bench.$b" ${extra[@]+"${extra[@]}"} || status=1
done
if [ -n "${OUT:-}" ]; then
  cp bench/results/*.md bench/results/*.json "$OUT"/ 2>/dev/null || true
fi
exit "$status"
