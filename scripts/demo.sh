#!/usr/bin/env bash
# The main demo: optimize a sample model, save it, load it in a fresh process without torch, check it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
cd "$root"
exec "$BLADEPACK_PY" -m samples.demo "$@"
