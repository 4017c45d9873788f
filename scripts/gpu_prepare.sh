#!/usr/bin/env bash
# On the development machine (no GPU needed): everything a lent GPU machine's check run needs, so its
# few minutes go to running, not compiling. Writes, all git-ignored:
#   .whl/                 the nvidia-cutlass wheel (the GPU machines lack it; gpu_checks.sh installs it)
#   .gpu-run/art/         every sample as a .bpk (float32: cpu + cuda; float16: cuda), its weights, the inputs
#                         of every test shape and float64 references (scripts/gpu_portable.py prepare)
#   .gpu-run/cache.tar.xz the CUTLASS units of bench.cutlass_gemm's checks and benchmark (sm80 and Hopper tables), compiled into a cache
#                         keyed by nvcc's version, flags and source (CUTLASS_PATH is /tmp/site/... on both sides)
#   .gpu-run/bin/         bpk-run and libbladepack_runtime.so.0 built without BLAS (the C++ CUDA path), and
#   .gpu-run/include.tar.xz  msgpack-cxx's headers (the GPU machines cannot build the C++ runtime without them)
#   .gpu-run/hopper/      the sm_90a GEMM probe's builds (scripts/hopper_probe.py prepare)
#   .gpu-run/kernels/     bench.gpu_kernels' artifacts (--save); with KERNELS_BASE=<git revision>, that
#   .gpu-run/kernels-base/  revision's artifacts of the same models (built from a worktree of it), the
#                         baseline gpu_checks.sh's gpu_kernels step times beside them
# Then, with the device tool: run `bash scripts/gpu_checks.sh` carrying .gpu-run and .whl.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
py="$BLADEPACK_PY"
mkdir -p .gpu-run .whl
compgen -G ".whl/nvidia_cutlass-*.whl" >/dev/null ||
  "$py" -m pip download -q --no-deps --only-binary=:all: -d .whl nvidia-cutlass==4.2.0.0
"$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/nvidia_cutlass-*.whl
export CUTLASS_PATH=/tmp/site/cutlass_library/source BLADEPACK_GEMM_TUNING=model PYTHONPATH="$root"
rm -rf .gpu-run/art .gpu-cache
"$py" scripts/gpu_portable.py prepare .gpu-run/art
"$py" -m bench.cutlass_gemm --prewarm "$root/.gpu-cache"
BLADEPACK_HOPPER_GEMMS=1 "$py" -m bench.cutlass_gemm --prewarm "$root/.gpu-cache"  # the sm_90a units too
BLADEPACK_CACHE_DIR="$root/.gpu-cache" "$py" scripts/hopper_probe.py prepare .gpu-run/hopper
rm -rf .gpu-run/kernels .gpu-run/kernels-base
"$py" -m bench.gpu_kernels --save .gpu-run/kernels >/dev/null
if [ -n "${KERNELS_BASE:-}" ]; then
  base="$(mktemp -d)/base"
  git worktree add -f --detach "$base" "$KERNELS_BASE" >/dev/null
  PYTHONPATH="$base" "$py" "$root/bench/gpu_kernels.py" --save .gpu-run/kernels-base >/dev/null
  git worktree remove --force "$base"
fi
tar cJf .gpu-run/cache.tar.xz .gpu-cache
cmake -S cpp_runtime -B build/cpp-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_DISABLE_FIND_PACKAGE_BLAS=ON >/dev/null
cmake --build build/cpp-gpu -j 2 --target bpk-run >/dev/null
mkdir -p .gpu-run/bin
cp build/cpp-gpu/bpk-run build/cpp-gpu/libbladepack_runtime.so.0 .gpu-run/bin/
[ -f /usr/include/msgpack.hpp ] && tar cJf .gpu-run/include.tar.xz -C /usr/include msgpack.hpp msgpack
du -sh .gpu-run .whl
