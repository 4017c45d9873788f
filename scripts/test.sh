#!/usr/bin/env bash
# The test suite: lint, types, then pytest (two workers). Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh"
bash "$root/scripts/system_deps.sh"
cd "$root"
bin="$(dirname "$BLADEPACK_PY")"
"$bin/ruff" check bladepack tests samples bench
"$bin/mypy" bladepack
exec "$BLADEPACK_PY" -m pytest -n 2 -q -m "not exhaustive and not zoo_full" "$@"
