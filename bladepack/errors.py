"""The exceptions bladepack raises. Loader-safe: no torch, no sympy.

Every error names what was wrong and what is allowed.
"""

from __future__ import annotations


class BladepackError(Exception):
    """Base class for every error bladepack raises on purpose."""


class BpkFormatError(BladepackError):
    """The .bpk file is not a valid artifact: bad magic, newer version, truncation, checksum mismatch."""


class InputError(BladepackError, ValueError):
    """A runtime input does not match the artifact's signature: count, rank, dtype or a dimension."""


class ExecutionError(BladepackError, RuntimeError):
    """A step failed at run time (for example an index outside its table)."""


class ShapeGuardError(InputError):
    """A dynamic dimension is outside its declared range, or dimensions that must agree do not."""


class UnsupportedOpsError(BladepackError):
    """The model uses operators bladepack cannot compile; lists every one with its source location."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        counts: dict[tuple[str, str], int] = {}
        for p in problems:  # one line per (op, place): a layer's line reached once per layer is one place
            counts[p] = counts.get(p, 0) + 1
        lines = [f"  - {op}  (at {loc})" + (f" x{n}" if n > 1 else "") for (op, loc), n in counts.items()]
        kinds = sorted({op for op, _ in problems})
        super().__init__(
            f"the model uses {len(kinds)} unsupported operator(s) at {len(counts)} place(s):\n" + "\n".join(lines)
        )


class ExportError(BladepackError):
    """torch.export could not capture the model with the requested dynamic dimensions."""
