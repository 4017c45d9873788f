"""The host CPU's feature flags (Linux /proc/cpuinfo). Loader-safe: standard library only.

In: nothing. Out: `cpu_flags()`, the set of flags ("avx2", "avx512f", ...), empty where unknown. Used
by the toolchain (which ISA level is the host's) and the loader (which kernel library to load).
"""

from __future__ import annotations

from pathlib import Path


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()
