#!/usr/bin/env bash
# Create or reuse .venv and install bladepack with its export and dev extras.
# torch 2.13.0 is installed first when torch is missing, so nothing else pulls a CUDA build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${BLADEPACK_VENV:-$root/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
py="$venv/bin/python"
if ! "$py" -c "import torch" >/dev/null 2>&1; then
  "$py" -m pip install -q --upgrade pip
  "$py" -m pip install -q "torch==2.13.0"
fi
stamp="$venv/.bladepack-installed"
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
  log="$(mktemp)"
  if ! "$py" -m pip install -q -e "$root[export,dev,serve,ray]" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  # the Triton server the serving tests start (Note [Finding Triton] in bladepack/serving/triton_server.py)
  if ! "$py" -m pip install -q --no-deps "nvidia-pytriton==0.7.0" >"$log" 2>&1; then
    cat "$log" >&2
    exit 1
  fi
  rm -f "$log"
  touch "$stamp"
fi
export BLADEPACK_PY="$py"
