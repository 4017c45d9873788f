"""A loaded artifact as a callable module.

In: a parsed `BpkFile`. Out: `LoadedModule`, which reads the manifest once (`Manifest`), picks one
executor — reference, native CPU or CUDA, each keeping the `Executor` contract of executor.py with
its own bounded per-shape cache (Note [Prepared plans]) — and dispatches every call to it.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

from bladepack.artifact.format import BpkFile
from bladepack.errors import ExecutionError, InputError
from bladepack.loader.cuda_module import CudaExecutor, parse_device
from bladepack.loader.executor import Executor
from bladepack.loader.manifest import Manifest
from bladepack.loader.native_cpu import NativeUnavailable
from bladepack.loader.native_executor import NativeExecutor
from bladepack.loader.out_of_range import SplitPolicy
from bladepack.loader.packed import PackedFile, PackedRunner, rows_min
from bladepack.loader.reference_executor import ReferenceExecutor
from bladepack.options import LoaderOptions

EXECUTORS = ("auto", "native", "reference")


class LoadedModule:
    """A loaded artifact. `executor`: "auto" runs the generated CPU kernels when the artifact has a
    library for this CPU (else warns and uses the reference executor), "native" insists on them,
    "reference" runs the numpy reference executor (the oracle)."""

    def __init__(
        self,
        bpk: BpkFile,
        device: str = "cpu",
        executor: str = "auto",
        on_out_of_range: dict[str, str] | None = None,
        graphs: bool = True,
        options: LoaderOptions | None = None,
    ) -> None:
        if executor not in EXECUTORS:
            raise ValueError(f"executor must be one of {EXECUTORS}, got {executor!r}")
        kind, ordinal = parse_device(device)
        self.device = device
        self._manifest = m = Manifest.read(bpk)
        # Note [Batch-like dims] (ir/batch_dims.py): checked before any kernel library is loaded
        self._split = SplitPolicy(bpk.manifest, on_out_of_range or {}, bpk.source)
        self._splits = bool(self._split)  # read once: a call without them goes straight to the executor
        self._bpk = bpk
        self.signature = m.signature
        options = options or LoaderOptions()  # the defaults: `load` reads the environment's
        self._how = (executor, options)  # for the packed form, loaded on first use
        self._packed: PackedRunner | None = None
        limit = options.shape_cache
        reference = ReferenceExecutor(m, limit)
        self._executor: Executor = reference
        if kind == "cpu" and m.bfloat16 and (executor == "reference" or m.native["cpu"] is None):
            raise ValueError(
                f"{bpk.source} computes in bfloat16, which the numpy reference executor cannot; load it with "
                "executor='native' (its CPU kernel library) or device='cuda'"
            )
        if kind == "cuda":
            if executor == "reference":
                raise ValueError("executor='reference' runs on the CPU; load with device='cpu'")
            self._executor = CudaExecutor(
                m, bpk, reference, ordinal, limit, options, options.cuda_graphs if graphs else 0
            )
        elif executor != "reference" and m.native["cpu"] is not None:
            try:
                self._executor = NativeExecutor(m, bpk, reference, limit, options)
            except NativeUnavailable as e:
                if executor == "native" or m.bfloat16:
                    raise
                warnings.warn(f"bladepack: {e}; running on the reference executor", RuntimeWarning, stacklevel=3)
        elif executor == "native":
            raise NativeUnavailable(f"{bpk.source} has no CPU kernel library (it was built without a C++ compiler)")
        # Note [Direct calls]: a call by position on a module without split policies goes straight to
        # the native executor's fast path (Note [Fast path] in fast_call.py), which returns None for
        # anything it does not take; that call then takes the executor's full path, once
        ex = self._executor
        self._direct: tuple[Callable[[Sequence[Any]], list[Any] | None], Callable[..., list[Any]]] | None = None
        if isinstance(ex, NativeExecutor) and ex.fast is not None and not self._splits:
            self._direct = (ex.fast, ex.run_checked)
        self._tuple_output = m.tuple_output

    @property
    def manifest(self) -> dict[str, Any]:
        """The artifact's manifest as read (docs/format.md): its signature, plans and records."""
        return self._bpk.manifest

    @property
    def executor(self) -> str:
        """ "native (<isa>)", "cuda (<image> on <device>)" or "reference": what runs this module's steps."""
        return self._executor.description

    # -- public API
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        direct = self._direct
        if direct is not None and not kwargs:
            fast, checked = direct
            got = fast(args)
            if got is None:
                got = checked(args, None)
            return tuple(got) if self._tuple_output or len(got) != 1 else got[0]
        if kwargs:
            names = [t.name for t in self.signature.inputs]
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                raise InputError(f"unknown input name(s) {unknown}; inputs are {names}")
            twice = [n for n in names[: len(args)] if n in kwargs]
            if twice:
                raise InputError(f"input(s) {twice} given both by position and by name")
            missing = [n for n in names[len(args) :] if n not in kwargs]
            if missing:
                raise InputError(f"missing input(s) {missing}; inputs are {names}")
            args = args + tuple(kwargs[n] for n in names[len(args) :])
        outs = self.run(args) if self._splits else self._executor.run(args, None)
        return tuple(outs) if self._tuple_output or len(outs) != 1 else outs[0]

    def run(self, inputs: Sequence[Any], outputs: Sequence[Any] | None = None) -> list[Any]:
        """Run on a list of inputs; with `outputs`, results are also copied into those arrays."""
        if self._split:
            plan = self._split.pieces(inputs)
            if plan is not None:
                return self._split.run(inputs, outputs, plan, lambda piece: self._executor.run(piece, None))
        return self._executor.run(inputs, outputs)

    def synchronize(self) -> None:
        """Wait for this module's device work and raise an index error one of its CUDA calls reported
        and no later call raised (Note [Device errors] in loader/cuda_module.py); on the CPU, nothing."""
        if isinstance(self._executor, CudaExecutor):
            self._executor.synchronize()

    def close(self) -> None:
        """`synchronize()`, then free the module's device memory and CUDA graphs; later calls raise
        ExecutionError. Also what leaving a `with bladepack.load(...) as m:` block does."""
        if isinstance(self._executor, CudaExecutor):
            self._executor.close()

    def __enter__(self) -> LoadedModule:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def packed(self) -> dict[str, Any] | None:
        """The packed form's record (Note [Packed sequences]): the ragged dim, its rows, and per input
        and output its (rows axis, sequence axis); None when the artifact has none."""
        record = self._bpk.manifest.get("packed")
        return None if record is None else {k: v for k, v in record.items() if k not in ("plan", "sections")}

    def run_packed(self, inputs: Sequence[Any], lengths: Sequence[int]) -> list[Any]:
        """Several sequences of different lengths in one call, without padding (an artifact optimized
        with packed=True): each ragged input (`packed["inputs"]`) holds the sequences one after the
        other along its sequence axis, its rows axis 1; `lengths` gives each sequence's length. The
        outputs hold the sequences' results one after the other along their sequence axis (an output
        with sequence axis -1 in `packed["outputs"]`, such as a classifier's logits, one row per
        sequence along its rows axis), as each sequence alone would give them. Each length is checked as
        a call of that sequence alone would be. Runs on this module's device: the packed form has a plan
        of every kind the artifact has (one built before packed CUDA plans runs packed on the CPU only)."""
        if self._packed is None:
            record = self._bpk.manifest.get("packed")
            if record is None:
                raise ValueError(
                    f"{self._bpk.source} has no packed form: optimize the model with packed=True (it needs a "
                    "sequence dim proven paddable with rows of their own length: `bladepack inspect` shows them)"
                )
            executor, options = self._how
            if not self.device.startswith("cpu") and record["plan"].get("native_cuda") is None:
                raise ValueError(
                    f"the packed form of {self._bpk.source} is a CPU plan (built before packed CUDA plans, or "
                    "without a CUDA target): load the artifact with device='cpu' to run it packed"
                )
            module = LoadedModule(PackedFile(self._bpk, record), self.device, executor, None, True, options)  # type: ignore[arg-type]
            names = [t.name for t in self.signature.inputs]
            rows = rows_min(self.signature, record)
            self._packed = PackedRunner(record, names, lambda shapes: self._output_shapes(*shapes), module, rows)
        return self._packed.run(inputs, lengths)

    def output_shapes(self, *input_shapes: Sequence[int]) -> list[tuple[int, ...]]:
        """Result shapes for the given input shapes, with every guard checked (no kernels run)."""
        if self._split:
            plan = self._split.pieces([SimpleNamespace(shape=tuple(s)) for s in input_shapes])
            if plan is not None:
                return self._split.shapes(input_shapes, plan, self._output_shapes)
        return self._output_shapes(*input_shapes)

    def _output_shapes(self, *input_shapes: Sequence[int]) -> list[tuple[int, ...]]:
        m = self._manifest
        regs = m.registers(tuple(tuple(int(d) for d in s) for s in input_shapes))
        return [m.shape(m.values[o]["shape"], regs) if o in m.values else () for o in m.outputs]

    def verify(self) -> dict[str, Any]:
        """Run the reference cases recorded at optimize time (Note [Reference cases]) on this module —
        this machine, device and executor — and report per case its dims and input shapes, the kernel
        variants and GEMM dispatch entries it ran, and per output the max abs and scaled error against
        the recorded output with a verdict; `passed` is True when every case passed (None when the
        artifact has no cases). `bladepack verify` prints it."""
        from bladepack.loader.verify import verify_report

        return verify_report(self._bpk.manifest, self._manifest, self._bpk.section, lambda xs: self.run(xs))

    def profile(self, *args: Any, repeat: int = 10) -> list[dict[str, Any]]:
        """Per-launch median wall time (µs) at these inputs: one row per kernel, GEMM or reference step,
        with what it computes and where it came from. Native executor only."""
        if not isinstance(self._executor, NativeExecutor):
            raise ValueError("profile() needs the native executor; this module runs on the reference executor")
        return self._executor.profile(args, repeat)


__all__ = ["EXECUTORS", "ExecutionError", "LoadedModule"]
