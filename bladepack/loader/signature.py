"""A loaded module's signature and the checks every call's inputs go through.

In: the manifest's inputs, outputs and symbols. Out: `Signature` (printable), and `check_inputs`, which
raises `InputError` naming the input, what was wrong and what is allowed: count, rank, dtype or a
static dim. Dynamic dims are checked by the shape program's guards.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bladepack.errors import InputError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: str
    shape: tuple[int | str, ...]

    def __str__(self) -> str:
        return f"{self.name}: {self.dtype}[{', '.join(str(d) for d in self.shape)}]"

    @staticmethod
    def from_manifest(m: dict[str, Any]) -> TensorSpec:
        """TypeError (a malformed manifest) unless the entry has a string name and dtype and a shape of
        integers and dim expressions."""
        name, dtype, shape = m["name"], m["dtype"], m["shape"]
        if not (
            isinstance(name, str)
            and isinstance(dtype, str)
            and isinstance(shape, list)
            and all(isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool)) for d in shape)
        ):
            raise TypeError("a tensor's name and dtype must be strings and its shape integers or dim expressions")
        return TensorSpec(name, dtype, tuple(shape))


@dataclass(frozen=True)
class SymbolSpec:
    name: str
    min: int
    max: int | None

    def __str__(self) -> str:
        return f"{self.name} in [{self.min}, {'inf' if self.max is None else self.max}]"


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    symbols: tuple[SymbolSpec, ...]

    def __str__(self) -> str:
        ins = ", ".join(str(t) for t in self.inputs)
        outs = ", ".join(str(t) for t in self.outputs)
        syms = "; ".join(str(s) for s in self.symbols)
        return f"({ins}) -> ({outs})" + (f" where {syms}" if syms else "")

    @staticmethod
    def from_manifest(m: dict[str, Any]) -> Signature:
        return Signature(
            tuple(TensorSpec.from_manifest(t) for t in m["inputs"]),
            tuple(TensorSpec.from_manifest(t) for t in m["outputs"]),
            tuple(_symbol(s) for s in m["symbols"]),
        )


def _integer(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _symbol(s: dict[str, Any]) -> SymbolSpec:
    """TypeError (a malformed manifest) unless the symbol has a string name and integer bounds."""
    name, lo, hi = s["name"], s["min"], s["max"]
    if not (isinstance(name, str) and _integer(lo) and (hi is None or _integer(hi))):
        raise TypeError("a symbol's name must be a string and its min and max integers (max may be None)")
    return SymbolSpec(name, lo, hi)


def check_inputs(sig: Signature, arrays: Sequence[np.ndarray]) -> None:
    if len(arrays) != len(sig.inputs):
        names = ", ".join(t.name for t in sig.inputs)
        raise InputError(f"expected {len(sig.inputs)} inputs ({names}), got {len(arrays)}")
    for spec, a in zip(sig.inputs, arrays):
        if a.ndim != len(spec.shape):
            raise InputError(
                f"input '{spec.name}' has rank {a.ndim} (shape {tuple(a.shape)}); expected rank "
                f"{len(spec.shape)}: {spec}"
            )
        if spec.dtype == "bfloat16":  # Note [bfloat16 on the host] (loader/tensors.py); a device tensor's
            if a.dtype.name not in ("uint16", "bfloat16"):  # DLPack dtype is named bfloat16
                raise InputError(
                    f"input '{spec.name}' has dtype {a.dtype.name}; expected bfloat16 (a torch bfloat16 tensor, "
                    "an ml_dtypes bfloat16 array or uint16 bfloat16 bit patterns)"
                )
        elif a.dtype.name != spec.dtype:
            raise InputError(f"input '{spec.name}' has dtype {a.dtype.name}; expected {spec.dtype}")
        for axis, (want, got) in enumerate(zip(spec.shape, a.shape)):
            if isinstance(want, int) and want != got:
                raise InputError(
                    f"input '{spec.name}' dimension {axis} is {got}; it is static and must be {want} ({spec})"
                )
