#!/usr/bin/env bash
# System packages the C++ runtime's build and tests need (Debian / Ubuntu names). Installs the missing
# ones with apt-get when this shell may (root, or passwordless sudo); otherwise says what is missing.
set -euo pipefail
missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v ninja >/dev/null 2>&1 || missing+=(ninja-build)
command -v g++ >/dev/null 2>&1 || missing+=(g++)
[ -f /usr/include/msgpack.hpp ] || missing+=(libmsgpack-cxx-dev)
[ -f /usr/include/openssl/evp.h ] || missing+=(libssl-dev)
compgen -G "/usr/include/*/openblas*/cblas.h" >/dev/null || compgen -G "/usr/include/openblas/cblas.h" >/dev/null ||
  missing+=(libopenblas-dev)
command -v clang++-14 >/dev/null 2>&1 || missing+=(clang-14)
compgen -G "/usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a" >/dev/null ||
  missing+=(libclang-rt-14-dev libfuzzer-14-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if command -v apt-get >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; }
  if [ "$(id -u)" -eq 0 ] || [ -n "$sudo" ]; then
    echo "installing ${missing[*]}" >&2
    $sudo apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
    exit 0
  fi
fi
echo "the C++ runtime's tests need these packages: ${missing[*]}" >&2
exit 1
