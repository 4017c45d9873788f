"""Write (or check) the files generated from bladepack's own tables.

    python scripts/generate.py           # rewrite them
    python scripts/generate.py --check   # exit 1, naming each, when one is stale (tests/test_generated.py)

- cpp_runtime/src/plan_ops.h: the plan ops the C++ runtime knows, from the op table (opset/table.py);
- docs/configuration.md: every knob of bladepack/options.py, from its `KNOBS` table.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def plan_ops_header() -> str:
    from bladepack.opset import OpKind

    names = [f'"{k.value}",' for k in OpKind]
    rows, row = [], "   "
    for n in names:
        if len(row) + 1 + len(n) > 120:
            rows.append(row)
            row = "   "
        row += " " + n
    rows.append(row)
    body = "\n".join(rows)
    return f"""// Generated from the op table (bladepack/opset/table.py) by scripts/generate.py: do not edit.
// The IR ops a plan may name; parse_manifest refuses a plan with any other (manifest.cpp).
#pragma once

namespace bpk {{

inline constexpr const char* kPlanOps[] = {{
{body}
}};

}}  // namespace bpk
"""


def configuration_page() -> str:
    from bladepack.options import knob_page

    return knob_page()


GENERATED: dict[str, Callable[[], str]] = {
    "cpp_runtime/src/plan_ops.h": plan_ops_header,
    "docs/configuration.md": configuration_page,
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="only check that every generated file is current")
    args = p.parse_args()
    stale = []
    for rel, make in GENERATED.items():
        path = ROOT / rel
        text = make()
        if path.exists() and path.read_text() == text:
            continue
        if args.check:
            stale.append(rel)
        else:
            path.write_text(text)
            print(f"wrote {rel}")
    if stale:
        print("stale generated files (run python scripts/generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
