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


class IndexRangeError(ExecutionError, InputError):
    """An index read from an input is outside its table (embedding, index_select, gather, take): the
    call fails like any step (ExecutionError), and the input is what was wrong (InputError: a server
    answers 400)."""


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


class CompileError(BladepackError):
    """An internal failure while optimizing (a bladepack bug): names the stage, and the op and its
    source line where the failing stage knows them; the original exception is its __cause__.

    Note [No raw tracebacks]: what optimize raises is a BladepackError. Front ends turn a converter's
    failure into UnsupportedOpsError naming the op and the model's line; each later stage (passes,
    plan, kernel builds) turns anything else into a CompileError naming the stage."""


class ExportError(BladepackError):
    """torch.export could not capture the model with the requested dynamic dimensions."""


class IllConditionedCase(Exception):
    """Not an error a user sees: an oracle's answer for a reference case that rests on rounding (Note
    [Conditioned cases] in reference_record.py), raised by the torch and ONNX oracles and caught where
    cases are recorded; the message says which order and how close."""
