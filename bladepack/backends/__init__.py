"""The backends, registered in one place: each plan kind's plug-in (the `Backend` interface of base.py).

`backends_for(target)` gives the plug-ins of a parsed `Target` in registry order (the order in which
their plans are lowered: the shape program's registers are allotted in it); a new backend is a module
beside cpu.py and cuda.py and a row here.
"""

from __future__ import annotations

from bladepack.backends.base import Backend, Built, Sources, Variant
from bladepack.backends.cpu import CpuBackend
from bladepack.backends.cuda import CudaBackend
from bladepack.target import KINDS, Target

REGISTRY: dict[str, Backend] = {b.kind: b for b in (CpuBackend(), CudaBackend())}
assert set(REGISTRY) == set(KINDS), "every plan kind Target.parse accepts needs a backend here"


def backend(kind: str) -> Backend:
    return REGISTRY[kind]


def backends_for(target: Target) -> tuple[Backend, ...]:
    return tuple(b for kind, b in REGISTRY.items() if kind in target.kinds)


__all__ = ["REGISTRY", "Backend", "Built", "Sources", "Variant", "backend", "backends_for"]
